"""The environment of the scale-out tests: every tool output names the backend process that ran it.

`metadata.pid` is the backend's process id (the server's, also when the
tool runs in one of its worker processes), so a test can see, from results
alone, which backend answered each call of a session.
"""

from __future__ import annotations

import functools

import psutil
from pydantic import BaseModel

from ors_grpc import Environment, Split, TextBlock, ToolOutput, tool

TASKS = [{"a": index, "b": 2 * index + 1} for index in range(20)]


@functools.lru_cache(maxsize=1)
def backend_pid() -> int:
    """The serving process: this one, or, in a worker or an episode process (and the template it
    was forked from), the server above it."""
    process = psutil.Process()
    while "ors_grpc._runtime.workers" in " ".join(process.cmdline()):
        process = process.parent()
    return process.pid


class AddInput(BaseModel):
    a: int
    b: int


class AnswerInput(BaseModel):
    answer: int


class WhoAmI(Environment):
    """Add the task's two numbers: `add` is the step, `submit` ends the episode."""

    @classmethod
    def list_splits(cls) -> list[Split]:
        return [Split(name="train", type="train")]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return TASKS

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"What is {self.task_spec['a']} + {self.task_spec['b']}?")]

    @tool
    def add(self, params: AddInput) -> ToolOutput:
        """Add two integers."""
        return ToolOutput(blocks=[TextBlock(text=str(params.a + params.b))], metadata={"pid": backend_pid()})

    @tool
    def submit(self, params: AnswerInput) -> ToolOutput:
        """Submit the sum; ends the episode."""
        correct = params.answer == self.task_spec["a"] + self.task_spec["b"]
        return ToolOutput(
            blocks=[TextBlock(text="correct" if correct else "wrong")],
            reward=1.0 if correct else 0.0,
            finished=True,
            metadata={"pid": backend_pid()},
        )
