"""One door of the benchmark measured on a fresh server: which server, which load, the result of a round."""

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.floors import SERVER_OF as FLOOR_SERVERS
from bench.placements import tree_cpu_seconds
from bench.servers import ServerProcess, floor_server, ours_server, reference_server, run_load

#: Door name suffixes that pin where the environment's sync code runs, and
#: the value of ORS_BENCH_SYNC_CODE (read by bench/env.py) that pins it.
SYNC_CODE_SUFFIXES = {"-threads": "threads", "-on-loop": "loop"}
MIB = 1024 * 1024


@dataclass
class DoorResult:
    """Everything measured on one door; ``skipped`` says why nothing was."""

    door: str
    load: dict | None = None
    image: dict | None = None
    skipped: str | None = None
    #: Episodes/s of every round; `load` is the median round's.
    rounds: list[float] = field(default_factory=list)


def server_for(door: str, args: argparse.Namespace, tree: Path | None = None) -> tuple[ServerProcess, set[str]]:
    """A not yet started server for ``door`` and the ports it must print; ``tree``: another
    checkout whose code serves it (``--against``), else this one."""
    if tree is not None:
        server, ports = server_for(door, args)
        server.cwd = tree
        server.extra_env["PYTHONPATH"] = str(tree)
        return server, ports
    if door == "reference":
        return reference_server(quiet=args.quiet_reference), {"HTTP"}
    if door in FLOOR_SERVERS:
        kind = FLOOR_SERVERS[door]
        return floor_server(kind), {"HTTP"} if kind == "http" else {"gRPC"}
    serve_args = tuple(args.serve_args.split())
    if door == "mcp":
        return ours_server(http=False, mcp=True, serve_args=serve_args), {"gRPC", "MCP"}
    server = ours_server(http=door.startswith("bridge"), serve_args=serve_args)
    for suffix, sync_code in SYNC_CODE_SUFFIXES.items():
        if door.endswith(suffix):
            server.extra_env["ORS_BENCH_SYNC_CODE"] = sync_code
    return server, {"gRPC", "HTTP"} if door.startswith("bridge") else {"gRPC"}


def target_of(door: str, server: ServerProcess) -> tuple[str, str]:
    """(load-generator door kind, target address) of a started server."""
    for suffix in SYNC_CODE_SUFFIXES:
        door = door.removesuffix(suffix)
    if door in ("grpc", "grpc-raw", "floor-grpc", "floor-grpc-unary"):
        return door, f"127.0.0.1:{server.ports['gRPC']}"
    if door == "floor-http":
        return door, f"http://127.0.0.1:{server.ports['HTTP']}"
    if door == "mcp":
        return "mcp", f"http://127.0.0.1:{server.ports['MCP']}"
    return "http", f"http://127.0.0.1:{server.ports['HTTP']}"


def start_or_skip(server: ServerProcess, ports: set[str]) -> str | None:
    """Starts `server`; why it could not (the row is then skipped), else None."""
    try:
        server.start(ports)
    except (RuntimeError, OSError) as exc:
        return str(exc).splitlines()[0][:200]
    return None


def measure_door(door: str, args: argparse.Namespace, with_image: bool, tree: Path | None = None) -> DoorResult:
    """Closed-loop episodes, then (`with_image`) the large image, on one fresh server (of `tree`'s code)."""
    result = DoorResult(door)
    server, ports = server_for(door, args, tree)
    server.extra_env["ORS_BENCH_IMAGE_BYTES"] = str(int(args.image_mib * MIB))
    result.skipped = start_or_skip(server, ports)
    if result.skipped:
        return result
    with server:
        kind, target = target_of(door, server)
        timeout = args.warmup + args.duration + 120
        cpu_before, wall_before = tree_cpu_seconds(server.proc.pid), time.perf_counter()  # workers' too
        result.load = run_load(kind, target, "episodes", timeout, workers=args.workers,
                               warmup=args.warmup, duration=args.duration)
        cpu = tree_cpu_seconds(server.proc.pid) - cpu_before
        result.load["server_cpu"] = cpu / (time.perf_counter() - wall_before)
        if with_image and args.image_calls and door not in FLOOR_SERVERS:
            result.image = run_load(kind, target, "image", 300, count=args.image_calls)
    return result


def episodes_per_second(result: DoorResult) -> float:
    return result.load["episodes"] / result.load["seconds"]


def median_round(rounds: list[DoorResult]) -> DoorResult:
    """The round with the median episodes/s (the image figures of the first round)."""
    measured = sorted((r for r in rounds if not r.skipped), key=episodes_per_second)
    if not measured:
        return rounds[0]
    median = measured[(len(measured) - 1) // 2]
    median.image = rounds[0].image
    median.rounds = [episodes_per_second(r) for r in rounds if not r.skipped]
    return median
