"""The environment of ``python -m bench --setup-seconds S``: a slow setup, a rollout as long.

``setup()`` waits ``ORS_BENCH_SETUP_SECONDS`` (what booting a sandbox or a
container costs an agentic environment, asynchronously: the server waits on
it, it does not compute); ``act`` is one environment step of a rollout.
"""

import asyncio
import os

from pydantic import BaseModel

from ors_grpc import Environment, Split, TextBlock, ToolOutput, tool

SETUP_SECONDS = float(os.environ.get("ORS_BENCH_SETUP_SECONDS", "2"))


class ActInput(BaseModel):
    seconds: float


class SetupEnv(Environment):
    """Each episode's setup takes SETUP_SECONDS; `act` takes what it is told; `submit` ends the episode."""

    @classmethod
    def list_splits(cls) -> list:
        return [Split(name="train", type="train")]

    @classmethod
    def list_tasks(cls, split: str) -> list:
        return [{"id": i} for i in range(1000)]

    async def setup(self) -> None:
        await asyncio.sleep(SETUP_SECONDS)

    def get_prompt(self) -> list:
        return [TextBlock(text=f"Solve task {self.task_spec['id']}.")]

    @tool
    async def act(self, params: ActInput) -> ToolOutput:
        """One step of the rollout in the environment."""
        await asyncio.sleep(params.seconds)
        return ToolOutput(blocks=[TextBlock(text="acted")])

    @tool
    def submit(self) -> ToolOutput:
        """Ends the episode with a reward."""
        return ToolOutput(blocks=[TextBlock(text="done")], reward=1.0, finished=True)
