"""The load generator: ``python -m bench.load --door http|grpc|grpc-raw --target ... --mode ...``.

Runs in its own process (the benchmark starts one per measurement) and prints
one JSON object. Modes:

- ``episodes``: closed loop; ``--workers`` tasks each run whole episodes back
  to back for ``--warmup`` + ``--duration`` seconds; only the ``--duration``
  window is counted.
- ``sessions``: opens ``--count`` idle sessions (created, setup done) and
  leaves them open, ``--workers`` at a time.
- ``image``: one session calls ``big_image`` ``--count`` times in a row, after
  one uncounted call.
"""

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.stats import latency_summary


#: Door kinds: raw HTTP/SSE, our Python gRPC client, the bare generated stubs, raw MCP, the floors
#: (bench/floors.py: bare aiohttp and grpc.aio carrying the same requests without application code),
#: and other ecosystems' environments (bench/ecosystem_doors.py).
DOOR_KINDS = ("http", "grpc", "grpc-raw", "mcp", "floor-http", "floor-grpc", "floor-grpc-unary",
              "rg-http", "rg-grpc", "openenv-direct", "openenv-grpc")


def make_door(kind: str, target: str):
    if kind.startswith("floor-"):
        from bench.floors import make_floor_door
        return make_floor_door(kind, target)
    if kind.startswith(("rg-", "openenv-")):
        from bench.ecosystem_doors import DOORS
        return DOORS[kind](target)
    if kind == "http":
        from bench.http_door import HttpDoor
        return HttpDoor(target)
    if kind == "mcp":
        from bench.mcp_door import McpDoor
        return McpDoor(target)
    if kind == "grpc":
        from bench.client_door import ClientDoor
        return ClientDoor(target)
    from bench.grpc_door import GrpcDoor
    return GrpcDoor(target)


async def run_episode(door, on_tool_call: Callable[[float], None], on_create: Callable[[float], None]) -> None:
    """Session id, create, prompt, 4 steps, a final submit, delete, delete session.

    ``on_tool_call`` receives each tool call's latency in seconds, ``on_create``
    the creation's. Doors with their own episode (the client's session context
    manager) run that.
    """
    if hasattr(door, "episode"):
        return await door.episode(on_tool_call, on_create)
    sid = await door.new_session_id()
    start = time.perf_counter()
    await door.open_episode(sid, 10)
    on_create(time.perf_counter() - start)
    for n in (1, 2, 3, 4):
        start = time.perf_counter()
        await door.call_tool(sid, "step", {"n": n})
        on_tool_call(time.perf_counter() - start)
    start = time.perf_counter()
    output = await door.call_tool(sid, "submit", {"answer": 10})
    on_tool_call(time.perf_counter() - start)
    if not output["finished"] or output["reward"] != 1.0:
        raise RuntimeError(f"unexpected submit output: {output}")
    await door.close_episode(sid)


class Errors:
    """Counts failures and keeps the first message, for the report."""

    def __init__(self) -> None:
        self.count = 0
        self.first = None

    def add(self, exc: BaseException) -> None:
        self.count += 1
        self.first = self.first or f"{type(exc).__name__}: {exc}"[:300]


async def episodes(door, workers: int, warmup: float, duration: float) -> dict:
    window_start = time.perf_counter() + warmup
    window_end = window_start + duration
    latencies: list[float] = []
    creations: list[float] = []
    completed = 0
    errors = Errors()

    def on_tool_call(latency: float) -> None:
        if window_start <= time.perf_counter() <= window_end:
            latencies.append(latency)

    def on_create(latency: float) -> None:
        if window_start <= time.perf_counter() <= window_end:
            creations.append(latency)

    async def worker() -> None:
        nonlocal completed
        while time.perf_counter() < window_end:
            try:
                await run_episode(door, on_tool_call, on_create)
            except Exception as exc:  # keep loading; the report shows the errors
                errors.add(exc)
                await asyncio.sleep(0.01)
                continue
            if window_start <= time.perf_counter() <= window_end:
                completed += 1

    await asyncio.gather(*(worker() for _ in range(workers)))
    return {"episodes": completed, "seconds": duration, "tool_calls": latency_summary(latencies),
            "creates": latency_summary(creations), "errors": errors.count, "first_error": errors.first}


async def creations(door, count: int, pause: float) -> dict:
    """`count` episodes one after another, each `pause` seconds after the last ended, so that a
    pool of started processes (`--isolation episode`) is refilled: what a creation costs when
    the pool is warm, not when a closed loop has emptied it."""
    latencies: list[float] = []
    errors = Errors()
    for _ in range(count):
        await asyncio.sleep(pause)
        try:
            await run_episode(door, lambda _: None, latencies.append)
        except Exception as exc:
            errors.add(exc)
    return {"creates": latency_summary(latencies), "errors": errors.count, "first_error": errors.first}


async def sessions(door, workers: int, count: int) -> dict:
    remaining = count
    errors = Errors()
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            try:
                await door.open_idle_session()
            except Exception as exc:
                errors.add(exc)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return {"opened": count - errors.count, "seconds": time.perf_counter() - start,
            "errors": errors.count, "first_error": errors.first}


async def image(door, count: int) -> dict:
    if hasattr(door, "image_calls"):
        size, latencies = await door.image_calls(count)
        return {"image_bytes": size, "latency": latency_summary(latencies)}
    sid = await door.new_session_id()
    await door.open_episode(sid, 10)
    size = await door.image_call(sid)  # uncounted: builds the image once
    latencies = []
    for _ in range(count):
        start = time.perf_counter()
        size = await door.image_call(sid)
        latencies.append(time.perf_counter() - start)
    await door.close_episode(sid)
    return {"image_bytes": size, "latency": latency_summary(latencies)}


async def main_async(args: argparse.Namespace) -> dict:
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    async with make_door(args.door, args.target) as door:
        if args.mode == "episodes":
            result = await episodes(door, args.workers, args.warmup, args.duration)
        elif args.mode == "creations":
            result = await creations(door, args.count, args.pause)
        elif args.mode == "sessions":
            result = await sessions(door, args.workers, args.count)
        else:
            result = await image(door, args.count)
    # Shows whether the load generator itself was the bottleneck.
    result["loadgen_cpu"] = (time.process_time() - cpu_start) / (time.perf_counter() - wall_start)
    return result


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.load")
    parser.add_argument("--door", choices=DOOR_KINDS, required=True)
    parser.add_argument("--target", required=True, help="http://127.0.0.1:PORT or 127.0.0.1:PORT")
    parser.add_argument("--mode", choices=["episodes", "creations", "sessions", "image"], required=True)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--pause", type=float, default=0.1, help="seconds between episodes (--mode creations)")
    return parser.parse_args(argv)


def run(main: Any) -> Any:
    """Run on uvloop when installed: a cheaper load generator leaves more of
    the shared cores to the server under test, whichever it is."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    print(json.dumps(run(main_async(args))), flush=True)


if __name__ == "__main__":
    main()
