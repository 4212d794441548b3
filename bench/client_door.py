"""One ORS episode through our Python gRPC client, ``ors_grpc.client.AsyncORSClient``.

What a user of the gRPC door runs: the session context manager mints the id,
creates the episode on a RunEpisode stream (a worker's previous episode's,
once there is one), runs the steps on it and deletes the episode on exit (its
keepalive pinger never fires within an episode this short).
"""

import base64
import time
from collections.abc import Callable

from ors_grpc.client import AsyncORSClient

ENV = "benchenv"
MAX_MESSAGE = 64 * 1024 * 1024


class ClientDoor:
    """Our gRPC service at ``target`` through one AsyncORSClient (one channel)."""

    def __init__(self, target: str):
        self.client = AsyncORSClient(target, max_message_bytes=MAX_MESSAGE)
        self.env = self.client.environment(ENV)

    async def __aenter__(self) -> "ClientDoor":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.close()

    async def episode(self, on_tool_call: Callable[[float], None], on_create: Callable[[float], None]) -> None:
        start = time.perf_counter()
        async with self.env.session(task={"target": 10}) as session:
            on_create(time.perf_counter() - start)
            prompt = await session.get_prompt()
            assert prompt and prompt[0].type == "text", prompt
            for n in (1, 2, 3, 4):
                start = time.perf_counter()
                await session.call_tool("step", {"n": n})
                on_tool_call(time.perf_counter() - start)
            start = time.perf_counter()
            output = await session.call_tool("submit", {"answer": 10})
            on_tool_call(time.perf_counter() - start)
            if not output.finished or output.reward != 1.0:
                raise RuntimeError(f"unexpected submit output: {output}")

    async def image_calls(self, count: int) -> tuple[int, list[float]]:
        """``big_image`` once uncounted, then ``count`` times; (raw image bytes, latencies)."""
        async with self.env.session(task={"target": 10}) as session:
            await session.call_tool("big_image")
            latencies = []
            for _ in range(count):
                start = time.perf_counter()
                output = await session.call_tool("big_image")
                latencies.append(time.perf_counter() - start)
        return len(base64.b64decode(output.blocks[0].data)), latencies
