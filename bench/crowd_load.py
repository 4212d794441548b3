"""One share of a crowd: ``python -m bench.crowd_load --target ... --count N --procs P --index I``.

Runs the episodes of global index I, I + P, I + 2P, ... of a crowd of N
(``bench/crowd.py``) through one ``AsyncORSClient`` (one channel), each
starting at ``--start-at`` (wall clock) + its index / N think times, each
step ``--think-s`` after the last one's answer. Prints one JSON object: each
step's latencies in seconds by kind, each episode's overhead (its wall time
less its think times), the completed and failed episodes, the first error,
and this process's CPU as a share of a core.
"""

import argparse
import asyncio
import json
import sys
import time

from bench.client_door import ENV, MAX_MESSAGE
from bench.load import Errors, run

#: An episode's steps, in order; a think time separates each from the next.
STEP_KINDS = ("create", "prompt", "call", "delete")
#: Think times in one episode: between create, prompt, 4 steps, submit and delete.
THINKS = 7


async def crowd_episode(env, start_at: float, think_s: float, latencies: dict[str, list[float]]) -> float:
    """One episode of bench/load.py's shape, a think time before each step after the creation; returns its
    overhead (wall time less its think times). Raises on any failure."""
    await asyncio.sleep(max(0.0, start_at - time.time()))
    began = time.perf_counter()

    async def timed(kind: str, step):
        if kind != "create":
            await asyncio.sleep(think_s)
        started = time.perf_counter()
        result = await step
        latencies[kind].append(time.perf_counter() - started)
        return result

    session = env.session(task={"target": 10})
    await timed("create", session.__aenter__())
    try:
        prompt = await timed("prompt", session.get_prompt())
        if not prompt or prompt[0].type != "text":
            raise RuntimeError(f"unexpected prompt: {prompt}")
        for n in (1, 2, 3, 4):
            await timed("call", session.call_tool("step", {"n": n}))
        output = await timed("call", session.call_tool("submit", {"answer": 10}))
        if not output.finished or output.reward != 1.0:
            raise RuntimeError(f"unexpected submit output: {output}")
    except BaseException:
        await session.close()
        raise
    await timed("delete", session.close())
    return time.perf_counter() - began - THINKS * think_s


async def crowd_share(args: argparse.Namespace) -> dict:
    from ors_grpc.client import AsyncORSClient

    cpu_start, wall_start = time.process_time(), time.perf_counter()
    latencies: dict[str, list[float]] = {kind: [] for kind in STEP_KINDS}
    overheads: list[float] = []
    errors = Errors()

    async def one(index: int) -> None:
        try:
            overheads.append(await crowd_episode(env, args.start_at + index * args.think_s / args.count,
                                                 args.think_s, latencies))
        except Exception as exc:  # the report counts it and shows the first
            errors.add(exc)

    async with AsyncORSClient(args.target, max_message_bytes=MAX_MESSAGE) as client:
        env = client.environment(ENV)
        await asyncio.gather(*(one(index) for index in range(args.index, args.count, args.procs)))
    return {
        "latencies": {kind: [round(v, 6) for v in values] for kind, values in latencies.items()},
        "overheads": [round(v, 6) for v in overheads],
        "completed": len(overheads), "failed": errors.count, "first_error": errors.first,
        "loadgen_cpu": (time.process_time() - cpu_start) / (time.perf_counter() - wall_start),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.crowd_load")
    parser.add_argument("--target", required=True, help="127.0.0.1:PORT")
    parser.add_argument("--count", type=int, required=True, help="episodes in the whole crowd")
    parser.add_argument("--procs", type=int, default=1, help="load-generator processes sharing the crowd")
    parser.add_argument("--index", type=int, default=0, help="this process's share: episodes index, +procs, ...")
    parser.add_argument("--think-s", type=float, default=10.0)
    parser.add_argument("--start-at", type=float, required=True, help="wall-clock time of the first start")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    print(json.dumps(run(crowd_share(args))), flush=True)


if __name__ == "__main__":
    main()
