"""``python -m bench --envoy``: what Envoy adds per call, and what it carries with 1 and 3 backends.

Both parts use the Envoy topology of ``deploy/envoy/run_topology.py``
(``EnvoyTopology``: each backend serves ``bench.env:BenchEnv`` on its gRPC
port and its HTTP door; Envoy routes ``x-session-id`` on a gRPC and an HTTP
listener, to the backend a session id names, else by its hash) and the benchmark's own closed-loop load generator
(``bench.load``, episodes of 5 tool calls).

1. Added latency: one backend; the same load, in one run, straight at the
   backend's door and through Envoy's listener, alternating for
   ``--rounds`` rounds on each door (gRPC: ``ors_grpc.client`` on
   RunEpisode streams; HTTP: the aiohttp client of the bridge figures).
   Per-call p50 and p99 are the median rounds'.
2. Throughput: episodes/s through Envoy's listeners with 1 and with 3
   backends (alternating for ``--rounds`` rounds; the median round's), with
   each backend's share of the sessions (its own metrics count them), the
   errors (lost episodes) and the routing keys two backends answered. On a machine whose cores are shared by
   the load generator, Envoy and the backends, 3 backends cannot be faster
   than 1: the figure to read there is the spread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

from bench.scaleout import cpu_seconds
from bench.servers import run_load
from bench.stats import fmt_ms
from deploy.envoy.check import sessions_created
from deploy.envoy.run_topology import EnvoyTopology, find_envoy

ENVIRONMENT = "bench.env:BenchEnv"
DOORS = ("grpc", "http")
BACKEND_COUNTS = (1, 3)
#: Seconds the load generator may take beyond its warm-up and measured window.
LOAD_TIMEOUT_MARGIN_S = 120


def load(kind: str, target: str, args: argparse.Namespace) -> dict:
    return run_load(kind, target, "episodes", args.warmup + args.duration + LOAD_TIMEOUT_MARGIN_S,
                    workers=args.workers, warmup=args.warmup, duration=args.duration)


def targets(topology: EnvoyTopology, door: str) -> dict[str, str]:
    """Where the load goes on `door`: the backend's own door, and Envoy's listener."""
    backend = topology.backends[0]
    if door == "grpc":
        return {"direct": backend.grpc_target, "envoy": topology.grpc_target}
    return {"direct": f"http://{backend.http_target}", "envoy": topology.http_url}


def median_of(loads: list[dict], key: str) -> float:
    return statistics.median(result["tool_calls"][key] for result in loads)


def load_with_cpu(door: str, target: str, topology: EnvoyTopology, args: argparse.Namespace) -> dict:
    """`load`, plus the cores' worth of CPU the backend and Envoy used meanwhile."""
    pids = {"backend_cpu": topology.backends[0].pid, "envoy_cpu": topology.envoy.pid}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.perf_counter()
    result = load(door, target, args)
    elapsed = time.perf_counter() - started
    return {**result, **{name: (cpu_seconds(pid) - before[name]) / elapsed for name, pid in pids.items()}}


def measure_latency(args: argparse.Namespace) -> None:
    """Direct vs through Envoy on each door, alternating, one backend."""
    with EnvoyTopology(1, (ENVIRONMENT,)) as topology:
        results: dict[tuple[str, str], list[dict]] = {}
        for _ in range(args.rounds):
            for door in DOORS:
                for path, target in targets(topology, door).items():
                    results.setdefault((door, path), []).append(load_with_cpu(door, target, topology, args))
    print(f"\n## Envoy's added latency per tool call: 1 backend, {args.workers} workers, {args.duration:g} s"
          f" per measurement (after {args.warmup:g} s warm-up), {args.rounds} rounds alternating direct and Envoy")
    print(f"{'door':>5} {'path':>7} {'episodes/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"
          f" {'backend CPU':>11} {'Envoy CPU':>9}")
    for door in DOORS:
        for path in ("direct", "envoy"):
            loads = results[(door, path)]
            rate = statistics.median(result["episodes"] / result["seconds"] for result in loads)
            cpu = {name: statistics.median(result[name] for result in loads) for name in ("backend_cpu", "envoy_cpu")}
            print(f"{door:>5} {path:>7} {rate:>10.1f} {fmt_ms(median_of(loads, 'p50')):>8}"
                  f" {fmt_ms(median_of(loads, 'p99')):>8} {sum(result['errors'] for result in loads):>6}"
                  f" {cpu['backend_cpu']:>11.0%} {cpu['envoy_cpu']:>9.0%}")
        added = {key: median_of(results[(door, "envoy")], key) - median_of(results[(door, "direct")], key)
                 for key in ("p50", "p99")}
        print(f"{door:>5} {'added':>7} {'':>10} {fmt_ms(added['p50']):>8} {fmt_ms(added['p99']):>8}")


@dataclass
class Carried:
    """One measurement through Envoy: the load's result, each backend's sessions, split routing keys."""

    load: dict
    shares: list[int]
    split: int


def measure_throughput(backends: int, door: str, args: argparse.Namespace) -> Carried:
    """Episodes through Envoy's `door` listener with `backends` backends, and who served them."""
    with EnvoyTopology(backends, (ENVIRONMENT,)) as topology:
        before = [sessions_created(backend.metrics_url) for backend in topology.backends]
        result = load(door, targets(topology, door)["envoy"], args)
        time.sleep(0.5)  # Envoy's access log, flushed every 100 ms
        shares = [sessions_created(backend.metrics_url) - count for backend, count in zip(topology.backends, before)]
        split = sum(len(answered) > 1 for answered in topology.routes().values())
    return Carried(result, shares, split)


def throughput_row(door: str, backends: int, runs: list[Carried]) -> str:
    """The median round's figures; errors, split keys and sessions summed over the rounds."""
    loads = [run.load for run in runs]
    rate = statistics.median(result["episodes"] / result["seconds"] for result in loads)
    shares = [sum(column) for column in zip(*(run.shares for run in runs))]
    spread = " / ".join(f"{share / sum(shares):.0%}" for share in shares) if sum(shares) else "-"
    row = (f"{door:>5} {backends:>8} {rate:>10.1f} {fmt_ms(median_of(loads, 'p50')):>8}"
           f" {fmt_ms(median_of(loads, 'p99')):>8} {sum(result['errors'] for result in loads):>6}"
           f" {sum(run.split for run in runs):>5}  {spread} of {sum(shares)} sessions")
    first_error = next((result["first_error"] for result in loads if result["first_error"]), None)
    return row + (f"\n      first error: {first_error}" if first_error else "")


def run(args: argparse.Namespace) -> int:
    if find_envoy() is None:
        print("Envoy figures skipped: Envoy is not installed (pip install -e '.[deploy]')")
        return 1
    measure_latency(args)
    runs: dict[tuple[str, int], list[Carried]] = {}
    for _ in range(args.rounds):  # alternating, as the latency rounds: drifts in the machine's load even out
        for door in DOORS:
            for backends in BACKEND_COUNTS:
                runs.setdefault((door, backends), []).append(measure_throughput(backends, door, args))
    print(f"\n## Through Envoy with 1 and 3 backends: {args.workers} workers, {args.duration:g} s"
          f" (after {args.warmup:g} s warm-up), {args.rounds} rounds alternating, on {os.cpu_count()} CPUs shared by the load generator,"
          f" Envoy and the backends")
    print(f"{'door':>5} {'backends':>8} {'episodes/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'split':>5}"
          f"  sessions per backend")
    for (door, backends), measured in runs.items():
        print(throughput_row(door, backends, measured))
    return 0
