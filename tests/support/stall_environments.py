"""An environment for the stall tests (`serve --worker-stall-limit`): tools
that hold a worker's event loop (a blocking call in an `async def`, a
spin), one that holds the GIL in C code, and the CPU-heavy and quick tools
of a healthy load."""

from __future__ import annotations

import asyncio
import re
import time

from ors_grpc import TextBlock, ToolOutput, tool
from tests.support.reliability_environments import SecondsInput
from tests.support.worker_environments import WorkerProbeEnv

#: Pure-Python work of one `crunch` call: some 20 ms, well past the 2 ms
#: after which sync code stays in threads.
CRUNCH_ROUNDS = 200_000


class StallProbeEnv(WorkerProbeEnv):
    """WorkerProbeEnv with tools that stall the process running them."""

    @tool
    async def block_loop(self, params: SecondsInput) -> ToolOutput:
        """The common bug: a blocking call inside `async def` (the loop runs nothing meanwhile)."""
        time.sleep(params.seconds)
        return ToolOutput(blocks=[TextBlock(text="slept")])

    @tool
    async def spin_loop(self) -> ToolOutput:
        """A busy loop inside `async def`: the loop never gets control back."""
        while True:
            pass

    @tool
    def hold_the_gil(self) -> ToolOutput:
        """Catastrophic backtracking: the regex engine (C) never lets the GIL go, so no thread of the
        process runs (a sync tool: it holds the GIL from a user-code thread)."""
        re.match(r"(a+)+$", "a" * 64 + "b")
        return ToolOutput(blocks=[])

    @tool
    def crunch(self) -> ToolOutput:
        """CPU-heavy sync work (it runs in a thread)."""
        total = 0
        for number in range(CRUNCH_ROUNDS):
            total += number * number % 7
        return ToolOutput(blocks=[TextBlock(text=str(total))])

    @tool
    async def tick(self) -> ToolOutput:
        """A quick `async def` call."""
        await asyncio.sleep(0)
        return ToolOutput(blocks=[TextBlock(text="tick")])
