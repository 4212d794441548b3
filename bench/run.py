"""The benchmark's command: serve ``bench.env:BenchEnv`` three ways, load each the same way, print the figures.

Doors: ``reference`` (ors-sdk's FastAPI server under uvicorn), ``bridge`` (our
HTTP bridge, ``ors-grpc serve --http-port``) and ``grpc`` (our gRPC service
through our Python client, ``ors_grpc.client``, RunEpisode streams that carry
a worker's episodes one after another). ``bridge-threads`` and
``grpc-threads`` are the same with the environment's sync code pinned to
threads (``sync_code_on_loop = False``); optionally ``bridge-on-loop``
and ``grpc-on-loop`` (pinned to the event loop, as the reference runs it) and
``grpc-raw`` (the gRPC service through the bare generated stubs, one RPC per
step). Each door gets a fresh server process and a separate load-generator
process (``bench.load``); the HTTP doors are driven by the same aiohttp code.
The floors (``bench/floors.py``: bare aiohttp and grpc.aio carrying the same
requests with no application code) run in the same rounds, and each door's
episodes/s is printed as a share of its floor's.
"""

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field

from bench.doors import MIB, DoorResult, measure_door, median_round, server_for, start_or_skip, target_of
from bench.floors import FLOOR_DOORS, print_shares
from bench.servers import run_load
from bench.stats import fmt_ms

DOORS = ("reference", "bridge", "grpc", "bridge-threads", "grpc-threads", *FLOOR_DOORS)
OPTIONAL_DOORS = ("bridge-on-loop", "grpc-on-loop", "grpc-raw", "mcp")
#: The doors ``--against`` compares by default: the HTTP bridge and the gRPC door through our client, and
#: their floors (measured once a round).
AGAINST_DOORS = ("bridge", "grpc", "floor-http", "floor-grpc")
@dataclass
class MemoryResult:
    label: str
    rss: dict[int, int] = field(default_factory=dict)  # open sessions -> bytes
    open_seconds: float = 0.0
    skipped: str | None = None


def measure_doors(args: argparse.Namespace) -> dict[str, DoorResult]:
    """Every door in turn, `args.rounds` times (a slow spell of a shared
    machine then hits one round of every door, not every round of one)."""
    rounds = [
        {door: measure_door(door, args, with_image=n == 0) for door in args.doors} for n in range(args.rounds)
    ]
    return {door: median_round([r[door] for r in rounds]) for door in args.doors}


def measure_memory(label: str, door: str, args: argparse.Namespace) -> MemoryResult:
    """Resident memory of a fresh, warmed-up server before and after opening idle sessions."""
    result = MemoryResult(label)
    server, ports = server_for(door, args)
    result.skipped = start_or_skip(server, ports)
    if result.skipped:
        return result
    with server:
        kind, target = target_of(door, server)
        kind = "grpc-raw" if kind == "grpc" else kind  # no client-side pinger per idle session
        # Warm up every code path an idle session touches, then let go of it.
        run_load(kind, target, "episodes", 60, workers=4, warmup=0, duration=0.5)
        time.sleep(0.5)
        result.rss[0] = server.rss_bytes()
        opened = 0
        for count in args.sessions:
            step = run_load(kind, target, "sessions", 1800, workers=args.workers, count=count - opened)
            if step["errors"]:
                raise RuntimeError(f"{label}: opening sessions failed: {step['first_error']}")
            opened = count
            result.open_seconds += step["seconds"]
            time.sleep(0.5)
            result.rss[count] = server.rss_bytes()
    return result


# --- report -----------------------------------------------------------------

def ratio(ours: float, reference: float) -> str:
    return f"{ours / reference:.2f}x" if reference else "n/a"


def print_load_table(results: dict[str, DoorResult], args: argparse.Namespace) -> None:
    print(f"\n## Closed loop: {args.workers} workers, {args.duration:g} s (after {args.warmup:g} s warm-up)")
    print(f"{'door':<14} {'episodes/s':>10} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"
          f" {'eps vs ref':>10} {'p99 vs ref':>10} {'server CPU':>10} {'loadgen CPU':>11}")
    ref = results.get("reference")
    ref_load = ref.load if ref else None
    for door, res in results.items():
        if res.skipped:
            print(f"{door:<14} skipped: {res.skipped}")
            continue
        load = res.load
        eps = load["episodes"] / load["seconds"]
        calls = load["tool_calls"]["count"] / load["seconds"]
        eps_ratio = p99_ratio = ""
        if ref_load and door != "reference":
            eps_ratio = ratio(eps, ref_load["episodes"] / ref_load["seconds"])
            p99_ratio = ratio(load["tool_calls"]["p99"], ref_load["tool_calls"]["p99"])
        print(f"{door:<14} {eps:>10.1f} {calls:>9.1f} {fmt_ms(load['tool_calls']['p50']):>8}"
              f" {fmt_ms(load['tool_calls']['p99']):>8} {load['errors']:>6} {eps_ratio:>10} {p99_ratio:>10}"
              f" {load['server_cpu']:>10.0%} {load['loadgen_cpu']:>11.0%}")
        if load["first_error"]:
            print(f"{'':<14} first error: {load['first_error']}")
    if args.rounds > 1:
        print(f"episodes/s in each of {args.rounds} rounds (rows above: each door's median round):")
        for door, res in results.items():
            print(f"{door:<14} " + "  ".join(f"{eps:.1f}" for eps in res.rounds))
    measured = {door: res.load["episodes"] / res.load["seconds"] for door, res in results.items() if res.load}
    if any(door in measured for door in FLOOR_DOORS):
        print("each door's episodes/s as a share of its floor's (bench/floors.py; median rounds):")
        print_shares(measured)


def print_image_table(results: dict[str, DoorResult], args: argparse.Namespace) -> None:
    print(f"\n## {args.image_mib:g} MiB image block from a tool: {args.image_calls} calls in a row")
    print(f"{'door':<14} {'mean ms':>9} {'p50 ms':>9} {'max ms':>9} {'vs ref':>8}")
    ref = results.get("reference")
    for door, res in results.items():
        if res.skipped or not res.image:
            continue
        lat = res.image["latency"]
        versus = ratio(lat["mean"], ref.image["latency"]["mean"]) if ref and ref.image and door != "reference" else ""
        print(f"{door:<14} {fmt_ms(lat['mean']):>9} {fmt_ms(lat['p50']):>9} {fmt_ms(lat['p99']):>9} {versus:>8}")


def print_memory_table(results: list[MemoryResult]) -> None:
    print("\n## Resident memory (VmRSS) of the server with idle open sessions")
    counts = sorted({count for res in results for count in res.rss if count})
    head = f"{'server':<22} {'base MiB':>8}" + "".join(f" {f'{c} MiB':>10} {'KiB/sess':>9}" for c in counts)
    print(head + f" {'open s':>7}")
    ref = results[0] if results and results[0].rss else None
    for res in results:
        if res.skipped:
            print(f"{res.label:<22} skipped: {res.skipped}")
            continue
        base = res.rss[0]
        row = f"{res.label:<22} {base / MIB:>8.1f}"
        for count in counts:
            row += f" {res.rss[count] / MIB:>10.1f} {(res.rss[count] - base) / count / 1024:>9.2f}"
        print(row + f" {res.open_seconds:>7.1f}")
    if ref:
        top = counts[-1]
        for res in results[1:]:
            if res.skipped:
                continue
            per = (res.rss[top] - res.rss[0]) / max(1, ref.rss[top] - ref.rss[0])
            print(f"{res.label} vs reference at {top} sessions: whole server {ratio(res.rss[top], ref.rss[top])},"
                  f" per session {per:.2f}x")


def print_header(args: argparse.Namespace) -> None:
    import uvicorn
    print("# ors-grpc benchmark")
    print(f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.machine()};"
          f" uvicorn {uvicorn.__version__} (loop/http: {uvicorn_impls()})")
    print("note: the load generator runs on the same cores as the server and competes with it for CPU.")
    if args.quiet_reference:
        print("reference runs with ORS_LOG_LEVEL=WARNING (its default is INFO, one log line per request)")


def uvicorn_impls() -> str:
    import importlib.util
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"{loop}/{http}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--doors", default=None,
                        help="comma-separated, from: " + ", ".join(DOORS + OPTIONAL_DOORS))
    parser.add_argument("--door", choices=OPTIONAL_DOORS + DOORS[1:], default=None,
                        help="measure this door next to the HTTP bridge only (e.g. mcp: MCP episodes/s beside "
                             "the bridge's), without the memory rows")
    parser.add_argument("--workers", type=int, default=32, help="concurrent closed-loop workers (32)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per door and round (10)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="closed-loop rounds over all doors; each door's median round is reported (3)")
    parser.add_argument("--warmup", type=float, default=2.0, help="uncounted seconds before (2)")
    parser.add_argument("--image-mib", type=float, default=8.0, help="image block size in MiB (8)")
    parser.add_argument("--image-calls", type=int, default=5, help="image calls per door, 0 to skip (5)")
    parser.add_argument("--sessions", default="1000,10000",
                        help="idle session counts for the memory figures, empty to skip (1000,10000)")
    parser.add_argument("--quiet-reference", action="store_true",
                        help="run the reference with ORS_LOG_LEVEL=WARNING instead of its INFO default")
    parser.add_argument("--against", metavar="REV",
                        help="instead: this checkout's server against commit REV's (checked out into a temporary"
                             " git worktree), interleaved rounds of the bridge and gRPC doors (--doors, where"
                             " reference is also allowed), and the ratios (bench/against.py)")
    parser.add_argument("--serve-args", default="", metavar="ARGS",
                        help="more `serve` arguments for our servers (the doors' and --against's), e.g."
                             " '--workers 2' to measure worker mode against another commit")
    parser.add_argument("--json", metavar="PATH", help="also write the raw results as JSON")
    parser.add_argument("--scaleout", action="store_true",
                        help="instead: the same workload against 1 and 2 backends behind nginx (bench/scaleout.py)")
    parser.add_argument("--scaleout-door", choices=("grpc", "http"), default="grpc",
                        help="scale-out load through nginx directly (grpc) or through one bridge (http)")
    parser.add_argument("--scaleout-backends", default="1,2", help="backend counts to compare (1,2)")
    parser.add_argument("--scaleout-step-ms", type=float, default=0.0,
                        help="CPU milliseconds each scale-out step spends in the backend (0)")
    parser.add_argument("--envoy", action="store_true",
                        help="instead: Envoy's added latency and episodes/s through it with 1 and 3 backends"
                             " (bench/envoy.py)")
    parser.add_argument("--placements", action="store_true",
                        help="instead: in-process, --workers 1, --workers 2 and --isolation episode, on the trivial"
                             " and a CPU-heavy environment, through the gRPC door (bench/placements.py)")
    parser.add_argument("--placement-workloads", default="trivial,cpu-sync,cpu-async",
                        help="workloads of --placements (trivial,cpu-sync,cpu-async)")
    parser.add_argument("--placement-rows", default=None,
                        help="rows of --placements, comma-separated serve arguments as labelled"
                             " (default all: in-process,--workers 1,--workers 2,--isolation episode)")
    parser.add_argument("--ecosystems", action="store_true",
                        help="instead: reasoning-gym's episodes/s through the HTTP and gRPC doors, and the cost of"
                             " fronting an OpenEnv server against calling it directly (bench/ecosystems.py)")
    parser.add_argument("--setup-seconds", type=float, default=None, metavar="S",
                        help="instead: a trainer's batch loop over episodes whose setup takes S seconds,"
                             " with and without preparing the next batch (warm episodes; bench/warm.py)")
    parser.add_argument("--batch", type=int, default=32, help="episodes per batch of --setup-seconds (32)")
    parser.add_argument("--batches", type=int, default=16, help="batches per loop of --setup-seconds (16)")
    parser.add_argument("--crowd", type=int, default=None, metavar="N",
                        help="instead: N concurrent gRPC episodes with think time between steps, in-process against"
                             " the default, and the ratio of their step latencies' p99 (bench/crowd.py)")
    parser.add_argument("--crowd-think-s", type=float, default=10.0, metavar="S",
                        help="seconds between an episode's steps under --crowd (10)")
    parser.add_argument("--crowd-procs", type=int, default=0, metavar="P",
                        help="load-generator processes sharing the crowd (default: one per 8,192 episodes)")
    parser.add_argument("--crowd-rounds", type=int, default=1,
                        help="rounds of --crowd, the modes' order alternating (1)")
    parser.add_argument("--crowd-timeout", type=float, default=600.0, metavar="S",
                        help="seconds a crowd may run past its last episode's think times before it is killed (600)")
    args = parser.parse_args(argv)
    if args.door is not None:  # one door next to the HTTP bridge, closed loop and image only
        args.doors, args.sessions = f"bridge,{args.door}", ""
    if args.doors is None:
        args.doors = ",".join(AGAINST_DOORS if args.against else DOORS)
    args.doors = [d for d in args.doors.split(",") if d]
    unknown = set(args.doors) - set(DOORS + OPTIONAL_DOORS)
    if unknown:
        parser.error(f"unknown doors: {', '.join(sorted(unknown))}")
    args.sessions = sorted(int(c) for c in args.sessions.split(",") if c)
    args.placement_workloads = [w for w in args.placement_workloads.split(",") if w]
    from bench.placements import PLACEMENTS, WORKLOADS
    unknown = set(args.placement_workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    labels = [label for label, _ in PLACEMENTS]
    args.placement_rows = labels if args.placement_rows is None else [r for r in args.placement_rows.split(",") if r]
    unknown = set(args.placement_rows) - set(labels)
    if unknown:
        parser.error(f"unknown placement rows: {', '.join(sorted(unknown))} (from: {', '.join(labels)})")
    args.scaleout_backends = sorted(int(c) for c in args.scaleout_backends.split(",") if c)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.setup_seconds is not None:
        from bench.warm import run
        return run(args)
    if args.against:
        from bench.against import run
        return run(args)
    print_header(args)
    if args.crowd is not None:
        from bench.crowd import run
        return run(args)
    if args.scaleout:
        from bench.scaleout import run
        return run(args)
    if args.envoy:
        from bench.envoy import run
        return run(args)
    if args.placements:
        from bench.placements import run
        return run(args)
    if args.ecosystems:
        from bench.ecosystems import run
        return run(args)
    results = measure_doors(args)
    print_load_table(results, args)
    if args.image_calls:
        print_image_table(results, args)
    memory: list[MemoryResult] = []
    if args.sessions:
        plans = [("reference", "reference"), ("ours (bridge+service)", "bridge"), ("ours (gRPC only)", "grpc")]
        memory = [measure_memory(label, door, args) for label, door in plans if door in args.doors]
        print_memory_table(memory)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"doors": {d: vars(r) for d, r in results.items()},
                       "memory": [vars(m) for m in memory]}, out, indent=2)
    return 0
