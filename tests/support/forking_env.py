"""An environment whose setup forks a child process per episode, as
environments that generate levels in a subprocess do."""

from __future__ import annotations

import os

from ors_grpc import Environment, TextBlock, ToolOutput, tool


class ForkingEnv(Environment):
    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"id": 0}]

    def setup(self) -> None:
        child = os.fork()
        if child == 0:  # the child never touches gRPC
            os._exit(0)
        os.waitpid(child, 0)

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"forked in {os.getpid()}")]

    @tool
    def done(self) -> ToolOutput:
        """End the episode."""
        return ToolOutput(blocks=[TextBlock(text="done")], finished=True)
