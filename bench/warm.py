"""``python -m bench --setup-seconds S``: a trainer's batch loop, with and without warm episodes.

A trainer runs batches of ``--batch`` episodes (all at once), one batch
after another. Each episode's ``setup()`` takes S seconds (``bench/setup_env.py``)
and its rollout about as long: ``TURNS`` turns, each the policy thinking
(S / 2 / TURNS on the client) and one environment step (as long, on the
server). Without warm episodes every batch pays setup then rollout; with
them, the trainer asks the server to prepare batch k+1
(``AsyncEnvironment.prepare``, the PrepareEpisodes RPC) as batch k starts,
so batch k+1's episodes are set up while batch k rolls out, and their
creation claims them. The first batch is never prepared (the trainer learns
its tasks as it starts), so over N batches the best ratio is 2N / (N + 1);
from the second batch on, 2.

One ``ors-grpc serve bench.setup_env:SetupEnv`` process serves both loops;
the trainer is this process, through our Python client (``ors_grpc.client``).
"""

import argparse
import asyncio
import statistics
import time

from bench.servers import ours_server

ENV = "setupenv"
TURNS = 4


async def episode(env, task: dict, setup_s: float) -> None:
    """One episode: the prompt, TURNS turns of thinking and acting, a submit."""
    think_s = act_s = setup_s / 2 / TURNS
    async with env.session(task) as session:
        await session.get_prompt()
        for _ in range(TURNS):
            await asyncio.sleep(think_s)
            await session.call_tool("act", {"seconds": act_s})
        output = await session.call_tool("submit")
        if not output.finished:
            raise RuntimeError(f"unexpected submit output: {output}")


async def batch_loop(target: str, args: argparse.Namespace, prepare: bool, first_task: int) -> list[float]:
    """The seconds of each batch of one loop; tasks are numbered from `first_task`."""
    from ors_grpc.client import AsyncORSClient

    def tasks(batch: int) -> list[dict]:
        return [{"id": first_task + batch * args.batch + i} for i in range(args.batch)]

    async with AsyncORSClient(target) as client:
        env = client.environment(ENV)
        seconds = []
        for batch in range(args.batches):
            started = time.perf_counter()
            if prepare and batch + 1 < args.batches:
                await env.prepare(tasks(batch + 1))
            await asyncio.gather(*(episode(env, task, args.setup_seconds) for task in tasks(batch)))
            seconds.append(time.perf_counter() - started)
    return seconds


def describe(label: str, seconds: list[float]) -> str:
    steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
    return (f"{label:<10} {sum(seconds):>8.2f} {seconds[0]:>9.2f} {steady:>10.2f}   "
            + " ".join(f"{s:.2f}" for s in seconds))


def run(args: argparse.Namespace) -> int:
    S, B, N = args.setup_seconds, args.batch, args.batches
    print("# ors-grpc benchmark: warm episodes in a trainer's batch loop")
    print(f"setup() {S:g} s per episode, rollout ~{S:g} s ({TURNS} turns of {S / 2 / TURNS:g} s policy"
          f" + {S / 2 / TURNS:g} s environment step), {N} batches of {B} episodes, gRPC (ors_grpc.client)")
    server = ours_server(http=False, environment="bench.setup_env:SetupEnv")
    server.extra_env["ORS_BENCH_SETUP_SECONDS"] = str(S)
    server.start({"gRPC"})
    with server:
        target = f"127.0.0.1:{server.ports['gRPC']}"
        cold = asyncio.run(batch_loop(target, args, prepare=False, first_task=0))
        warm = asyncio.run(batch_loop(target, args, prepare=True, first_task=N * B))
    print(f"\n{'loop':<10} {'total s':>8} {'batch 1 s':>9} {'batch 2+ s':>10}   every batch (s)")
    print(describe("cold", cold))
    print(describe("prepared", warm))
    print(f"\nbatch-loop ratio (cold / prepared, {N} batches): {sum(cold) / sum(warm):.2f}x")
    print(f"per-batch ratio from batch 2 on (median): "
          f"{statistics.median(cold[1:] or cold) / statistics.median(warm[1:] or warm):.2f}x")
    return 0
