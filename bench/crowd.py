"""``python -m bench --crowd N``: N concurrent gRPC episodes with think time, in-process against the default.

For each mode (``--in-process``; the default, no placement argument:
``--workers auto``) a fresh ``ors-grpc serve bench.env:BenchEnv`` carries a
crowd of N episodes through our Python client (``bench/crowd_load.py``),
each with bench/load.py's steps (create, prompt, 4 ``step`` calls,
``submit``, delete), ``--crowd-think-s`` apart: an agent's think time.
Starts are staggered evenly over one think time, so the crowd asks at a
steady rate (N / think steps/s) instead of in lock-step bursts. Each
session's client pings every 10 s, as the client does. The crowd is shared
round-robin by ``--crowd-procs`` load-generator processes, each one client
(one channel). Modes alternate their order round by round.

Per mode: episodes completed and failed, each step's latency (the
overhead beyond the think time; p50, p99, max over all steps, and p99 by
kind), each episode's overhead (its wall time less its think times), the
crowd's wall time, the CPU of the server and every process under it, the
peak of their summed RSS (sampled every 0.5 s), the load generators' CPU
(a share of a core each; near 100% the load generator is part of the
latency), and the load average before and after. Then default / in-process
of the all-steps p99.
"""

import argparse
import contextlib
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from bench.crowd_load import STEP_KINDS, THINKS
from bench.placements import descendants, serve_error, split_cpu_seconds
from bench.servers import REPO_ROOT, ours_server, vm_rss_bytes
from bench.stats import percentile

#: (label, serve arguments).
CROWD_MODES: tuple[tuple[str, tuple[str, ...]], ...] = (("in-process", ("--in-process",)), ("default", ()))
MIB = 1024 * 1024
#: Seconds between launching the load generators and the first start: their imports and their client.
LEAD_S = 3.0
RSS_SAMPLE_S = 0.5


@dataclass
class CrowdRun:
    mode: str
    unavailable: str | None = None
    latencies: dict[str, list[float]] = field(default_factory=dict)
    overheads: list[float] = field(default_factory=list)
    completed: int = 0
    failed: int = 0
    first_error: str | None = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_rss: int = 0
    loadgen_cpu: list[float] = field(default_factory=list)
    load_before: float = 0.0
    load_after: float = 0.0

    @property
    def steps(self) -> list[float]:
        return sorted(v for values in self.latencies.values() for v in values)

    @property
    def p99(self) -> float:
        return percentile(self.steps, 0.99)


def tree_rss_bytes(pid: int) -> int:
    """VmRSS of `pid` and every process under it, summed (shared pages count once per process)."""
    total = 0
    for proc in [pid, *descendants(pid)]:
        try:
            total += vm_rss_bytes(proc)
        except OSError:
            continue  # ended meanwhile
    return total


def procs_for(args: argparse.Namespace) -> int:
    return args.crowd_procs or max(1, -(-args.crowd // 8192))


def measure(mode: str, serve_args: tuple[str, ...], args: argparse.Namespace) -> CrowdRun:
    run = CrowdRun(mode)
    server = ours_server(http=False, serve_args=serve_args)
    try:
        server.start({"gRPC"}, timeout=60)
    except (RuntimeError, OSError) as exc:
        run.unavailable = serve_error(exc, server.name)
        return run
    procs = procs_for(args)
    with server, tempfile.TemporaryDirectory(prefix="bench-crowd-") as tmp:
        assert server.proc is not None
        pid = server.proc.pid
        run.load_before = os.getloadavg()[0]
        cpu_before, wall_before = sum(split_cpu_seconds(pid)), time.perf_counter()
        start_at = time.time() + LEAD_S
        outputs = [pathlib.Path(tmp, f"share-{index}.json") for index in range(procs)]
        with contextlib.ExitStack() as files:
            generators = [
                subprocess.Popen(
                    [sys.executable, "-m", "bench.crowd_load", "--target", f"127.0.0.1:{server.ports['gRPC']}",
                     "--count", str(args.crowd), "--procs", str(procs), "--index", str(index),
                     "--think-s", str(args.crowd_think_s), "--start-at", str(start_at)],
                    cwd=REPO_ROOT, stdout=files.enter_context(out.open("w")),
                    stderr=files.enter_context(out.with_suffix(".err").open("w")))
                for index, out in enumerate(outputs)
            ]
        deadline = time.monotonic() + LEAD_S + (THINKS + 1) * args.crowd_think_s + args.crowd_timeout
        while any(gen.poll() is None for gen in generators):
            run.peak_rss = max(run.peak_rss, tree_rss_bytes(pid))
            if time.monotonic() > deadline:
                for gen in generators:
                    gen.kill()
                raise RuntimeError(f"{mode}: the crowd did not finish within {args.crowd_timeout:g} s of its end")
            time.sleep(RSS_SAMPLE_S)
        run.wall_s = time.perf_counter() - wall_before - LEAD_S
        run.cpu_s = sum(split_cpu_seconds(pid)) - cpu_before
        run.load_after = os.getloadavg()[0]
        run.latencies = {kind: [] for kind in STEP_KINDS}
        for gen, out in zip(generators, outputs):
            if gen.returncode != 0:
                tail = out.with_suffix(".err").read_text()[-1500:]
                raise RuntimeError(f"{mode}: load generator exited {gen.returncode}: {tail}")
            share = json.loads(out.read_text().strip().splitlines()[-1])
            for kind in STEP_KINDS:
                run.latencies[kind] += share["latencies"][kind]
            run.overheads += share["overheads"]
            run.completed += share["completed"]
            run.failed += share["failed"]
            run.first_error = run.first_error or share["first_error"]
            run.loadgen_cpu.append(share["loadgen_cpu"])
    return run


def measure_all(args: argparse.Namespace) -> dict[str, list[CrowdRun]]:
    """Every mode in turn, `args.crowd_rounds` times, the order alternating from round to round."""
    runs: dict[str, list[CrowdRun]] = {mode: [] for mode, _ in CROWD_MODES}
    for round_ in range(args.crowd_rounds):
        order = CROWD_MODES if round_ % 2 == 0 else CROWD_MODES[::-1]
        for mode, serve_args in order:
            runs[mode].append(measure(mode, serve_args, args))
    return runs


def median_run(runs: list[CrowdRun]) -> CrowdRun:
    measured = sorted((r for r in runs if not r.unavailable), key=lambda r: r.p99)
    return measured[(len(measured) - 1) // 2] if measured else runs[0]


def seconds(values: list[float], fraction: float) -> str:
    return f"{percentile(sorted(values), fraction):.3f}" if values else "-"


def print_table(runs: dict[str, list[CrowdRun]], args: argparse.Namespace) -> None:
    print(f"\n## Crowd: {args.crowd} concurrent gRPC episodes, {args.crowd_think_s:g} s think time,"
          f" {procs_for(args)} load-generator process(es), each mode's median round of {args.crowd_rounds}"
          + (" (the lower of the middle two)" if args.crowd_rounds % 2 == 0 else ""))
    print("step latency = the overhead beyond the think time (seconds); episode over = wall time less"
          f" {THINKS} think times")
    print(f"{'mode':<11} {'ok':>6} {'failed':>6} {'p50 s':>7} {'p99 s':>7} {'max s':>7}"
          + "".join(f" {kind + ' p99':>10}" for kind in STEP_KINDS)
          + f" {'ep over p99':>11} {'wall s':>7} {'CPU s':>7} {'peak RSS MiB':>12} {'loadgen CPU':>11}"
          f" {'load avg':>11}")
    chosen = {mode: median_run(mode_runs) for mode, mode_runs in runs.items()}
    for mode, run in chosen.items():
        if run.unavailable:
            print(f"{mode:<11} not available: {run.unavailable}")
            continue
        steps = run.steps
        loadgen = "/".join(f"{cpu:.0%}" for cpu in run.loadgen_cpu)
        print(f"{mode:<11} {run.completed:>6} {run.failed:>6} {seconds(steps, 0.5):>7} {seconds(steps, 0.99):>7}"
              f" {max(steps) if steps else float('nan'):>7.3f}"
              + "".join(f" {seconds(run.latencies[kind], 0.99):>10}" for kind in STEP_KINDS)
              + f" {seconds(run.overheads, 0.99):>11} {run.wall_s:>7.1f} {run.cpu_s:>7.2f}"
              f" {run.peak_rss / MIB:>12.1f} {loadgen:>11} {f'{run.load_before:.1f}->{run.load_after:.1f}':>11}")
        if run.first_error:
            print(f"{'':<11} first error: {run.first_error}")
    base, ours = chosen["in-process"], chosen["default"]
    if not base.unavailable and not ours.unavailable and base.p99 > 0:
        rounds = "  ".join(f"{b.p99 and o.p99 / b.p99:.2f}x" for b, o in zip(runs["in-process"], runs["default"])
                           if not b.unavailable and not o.unavailable)
        print(f"\ndefault / in-process, p99 of all steps: {ours.p99 / base.p99:.2f}x"
              + (f" (each round: {rounds})" if args.crowd_rounds > 1 else ""))
        if args.crowd_rounds > 1:
            for mode, mode_runs in runs.items():
                print(f"{mode:<11} p99 s in each round: "
                      + "  ".join(f"{r.p99:.3f}" for r in mode_runs if not r.unavailable))


def run(args: argparse.Namespace) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"file descriptors: soft {soft}, hard {hard}; the server's gRPC streams per connection: up to 100,000"
          " (ors_grpc/_runtime/grpc_server.py BURST_OPTIONS)")
    print_table(measure_all(args), args)
    return 0
