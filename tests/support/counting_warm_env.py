"""WarmEnv (tests/support/warm_environments.py) with a tool whose runs can be counted,
for the TypeScript client's suites of warm episodes and exactly-once calls."""

from __future__ import annotations

from ors_grpc import TextBlock, ToolOutput, tool
from tests.support.warm_environments import WarmEnv


class CountingWarmEnv(WarmEnv):
    """A WarmEnv whose `count` tool answers how many times it ran in the episode."""

    def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        self.counted = 0

    @tool
    def count(self) -> ToolOutput:
        """Counts its own runs: the side effect an exactly-once call must do once."""
        self.counted += 1
        return ToolOutput(blocks=[TextBlock(text=str(self.counted))])
