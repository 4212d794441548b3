"""``python -m bench --scaleout``: one closed-loop workload against 1 and against 2 backends behind nginx.

Each measurement starts a fresh topology (``deploy/nginx/run_topology.py``):
K ``ors-grpc serve bench.env:BenchEnv`` backends behind nginx (consistent hash
on ``x-session-id``), and runs the benchmark's own load generator
(``bench.load``, closed-loop episodes) against it. Door ``grpc`` (default)
drives nginx directly with ``ors_grpc.client``, so what grows is the number of
backends; door ``http`` puts one ``ors-grpc bridge`` in front and drives it
with the same raw aiohttp code as the bridge figures (that single bridge
process then bounds the throughput). ``--scaleout-step-ms N`` makes each
``step`` spend N ms of CPU in the backend (``bench/busy_env.py``): the
CPU-bound environments that more backends are for.

The ratio is episodes/s with the most backends over episodes/s with one. On a
machine whose cores are shared by the load generator, nginx and the backends
it cannot reach the number of backends: read the CPU columns with it.
"""

import argparse
import os
import pathlib
import time
from dataclasses import dataclass

from bench.servers import run_load
from bench.stats import fmt_ms
from deploy.nginx.run_topology import Topology, find_nginx

ENVIRONMENT = "bench.env:BenchEnv"
#: The same environment with CPU work in ``step`` (``--scaleout-step-ms``).
BUSY_ENVIRONMENT = "bench.busy_env:BenchEnv"
DOORS = ("grpc", "http")


@dataclass
class ScaleoutResult:
    backends: int
    load: dict
    backends_cpu: float  # cores' worth, summed over the backends
    nginx_cpu: float
    bridge_cpu: float | None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_children(pid: int) -> list[int]:
    """`pid` and its direct children (nginx's work is done by its worker processes)."""
    children = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if ppid == pid:
            children.append(int(stat.parent.name))
    return [pid, *children]


def measure(backends: int, args: argparse.Namespace) -> ScaleoutResult:
    bridges = 1 if args.scaleout_door == "http" else 0
    environment = BUSY_ENVIRONMENT if args.scaleout_step_ms else ENVIRONMENT
    with Topology(backends, bridges, (environment,), access_log=False) as topology:
        pids = {"backends": [b.pid for b in topology.backends], "nginx": with_children(topology.nginx.pid),
                "bridge": [b.child.pid for b in topology.bridges]}
        before = {role: sum(cpu_seconds(pid) for pid in group) for role, group in pids.items()}
        started = time.perf_counter()
        if args.scaleout_door == "http":
            kind, target = "http", topology.bridge_urls[0]
        else:
            kind, target = "grpc", topology.nginx_target
        load = run_load(kind, target, "episodes", args.warmup + args.duration + 120,
                        workers=args.workers, warmup=args.warmup, duration=args.duration)
        elapsed = time.perf_counter() - started
        cpu = {role: (sum(cpu_seconds(pid) for pid in group) - before[role]) / elapsed
               for role, group in pids.items()}
    return ScaleoutResult(backends, load, cpu["backends"], cpu["nginx"], cpu["bridge"] if bridges else None)


def print_table(results: list[ScaleoutResult], args: argparse.Namespace) -> None:
    work = f", {args.scaleout_step_ms:g} ms of CPU per step" if args.scaleout_step_ms else ""
    print(f"\n## Scale-out behind nginx: door {args.scaleout_door}, {args.workers} workers,"
          f" {args.duration:g} s (after {args.warmup:g} s warm-up){work}")
    print(f"{'backends':>8} {'episodes/s':>10} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"
          f" {'backends CPU':>12} {'nginx CPU':>9} {'bridge CPU':>10} {'loadgen CPU':>11}")
    for res in results:
        load = res.load
        bridge = f"{res.bridge_cpu:.0%}" if res.bridge_cpu is not None else "-"
        print(f"{res.backends:>8} {load['episodes'] / load['seconds']:>10.1f}"
              f" {load['tool_calls']['count'] / load['seconds']:>9.1f} {fmt_ms(load['tool_calls']['p50']):>8}"
              f" {fmt_ms(load['tool_calls']['p99']):>8} {load['errors']:>6} {res.backends_cpu:>12.0%}"
              f" {res.nginx_cpu:>9.0%} {bridge:>10} {load['loadgen_cpu']:>11.0%}")
        if load["first_error"]:
            print(f"{'':>8} first error: {load['first_error']}")
    first, last = results[0], results[-1]
    base = first.load["episodes"] / first.load["seconds"]
    top = last.load["episodes"] / last.load["seconds"]
    ratio = f"{top / base:.2f}x" if base else "n/a"
    print(f"scaling ratio ({last.backends} backends vs {first.backends}): {ratio}"
          f" on {os.cpu_count()} CPUs shared by the load generator, nginx and the backends")


def run(args: argparse.Namespace) -> int:
    """Measure every backend count of ``args.scaleout_backends`` and print the table."""
    if find_nginx() is None:
        print("scale-out skipped: nginx is not installed (apt-get install -y nginx)")
        return 1
    # The backends inherit it: bench/busy_env.py reads it at import.
    os.environ["ORS_BENCH_STEP_CPU_MS"] = str(args.scaleout_step_ms)
    results = [measure(count, args) for count in args.scaleout_backends]
    print_table(results, args)
    return 0
