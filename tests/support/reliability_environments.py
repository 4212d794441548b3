"""Environments for the reliability tests, observable from outside the server process.

The server runs as a subprocess, so what the tests need to see travels in
tool outputs (per-session run counters, the most overlapping runs of a tool)
or in marker files written under the directory named by the environment
variable ORS_TEST_MARKER_DIR (teardowns).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from pydantic import BaseModel

from ors_grpc import Environment, GroupCandidate, TextBlock, ToolOutput, tool

MARKER_DIR_VARIABLE = "ORS_TEST_MARKER_DIR"
SECRET_NAME = "TOKEN"


class SecondsInput(BaseModel):
    seconds: float


class AnswerInput(BaseModel):
    answer: str


class ProbeEnv(Environment):
    """Counts its tools' runs per session; its teardown leaves a marker file.

    Task specs carry a `tag` naming the marker file (`teardown-<tag>`, holding
    the session's run counts as JSON).
    """

    def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        self.secrets = secrets
        self.runs: dict[str, int] = {}
        self.active = 0
        self.max_active = 0

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"tag": f"task-{index}", "answer": str(index)} for index in range(3)]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"prompt {self.task_spec.get('tag')}")]

    def teardown(self) -> None:
        folder = os.environ.get(MARKER_DIR_VARIABLE)
        if folder:
            # The run counts too: after `finished` no tool can report them.
            marker = Path(folder, f"teardown-{self.task_spec.get('tag')}")
            marker.write_text(json.dumps({"runs": self.runs}), encoding="utf-8")

    def _count(self, name: str) -> int:
        self.runs[name] = self.runs.get(name, 0) + 1
        return self.runs[name]

    @tool
    async def slow(self, params: SecondsInput) -> ToolOutput:
        """Sleeps; records how many runs of itself overlapped."""
        run = self._count("slow")
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await asyncio.sleep(params.seconds)
        finally:
            self.active -= 1
        return ToolOutput(blocks=[TextBlock(text=f"slow run {run}")])

    @tool
    def stats(self) -> ToolOutput:
        """This session's run counts and the most overlapping `slow` runs."""
        return ToolOutput(blocks=[], metadata={"runs": dict(self.runs), "max_active": self.max_active})

    @tool
    def echo_tag(self) -> ToolOutput:
        """The session's tag (tells sessions apart under load)."""
        self._count("echo_tag")
        return ToolOutput(blocks=[TextBlock(text=str(self.task_spec.get("tag")))])

    @tool
    def submit(self, params: AnswerInput) -> ToolOutput:
        """Grades the answer and ends the episode."""
        self._count("submit")
        correct = params.answer == self.task_spec.get("answer")
        return ToolOutput(blocks=[TextBlock(text="graded")], reward=1.0 if correct else 0.0, finished=True)

    @tool
    async def hang(self) -> ToolOutput:
        """Never answers on its own (for the per-call time limit)."""
        self._count("hang")
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    @tool
    def leak(self) -> ToolOutput:
        """Raises an error whose message carries the session's secret."""
        raise RuntimeError(f"tool failed with token {self.secrets.get(SECRET_NAME)}")


class LateFailingSetupEnv(ProbeEnv):
    """Setup raises after a moment, so that calls are already waiting for it."""

    async def setup(self) -> None:
        await asyncio.sleep(0.5)
        raise RuntimeError("setup exploded late")


class LeakySetupEnv(ProbeEnv):
    """Setup raises an error whose message carries the session's secret."""

    def setup(self) -> None:
        raise RuntimeError(f"cannot log in with token {self.secrets.get(SECRET_NAME)}")


class LeakyPromptEnv(ProbeEnv):
    """Its prompt and task tools raise errors whose messages carry the secret."""

    def get_prompt(self) -> list[TextBlock]:
        raise RuntimeError(f"no prompt for token {self.secrets.get(SECRET_NAME)}")

    async def list_task_tools(self):
        raise KeyError(f"no tools for token {self.secrets.get(SECRET_NAME)}")


class SizeInput(BaseModel):
    size: int


class SizesEnv(ProbeEnv):
    """Answers as large as asked: a tool result of `size` bytes, and a prompt
    of the task spec's `prompt_bytes` (for the message limit). Its
    `list_tasks` raises."""

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        raise KeyError("this environment's code raises outside a tool")

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="p" * int(self.task_spec.get("prompt_bytes", 1)))]

    @tool
    def blob(self, params: SizeInput) -> ToolOutput:
        """A text block of `size` bytes."""
        return ToolOutput(blocks=[TextBlock(text="x" * params.size)])


class ScoringProbeEnv(ProbeEnv):
    """ProbeEnv with `score_group`, counted as the run `score_group`: each
    scoring sleeps its candidates' largest `{"seconds": s}` metadata, then
    scores every candidate with its run number."""

    async def score_group(self, candidates: list[GroupCandidate]) -> list[float]:
        run = self._count("score_group")
        await asyncio.sleep(max(((c.metadata or {}).get("seconds", 0) for c in candidates), default=0))
        return [float(run)] * len(candidates)


class LengthInput(BaseModel):
    length: int


class LimitsEnv(ScoringProbeEnv):
    """For the protocol's limits: the task spec's `fail` ("prompt" or
    "setup") makes that raise an error message of `length` characters, and
    `hang` makes setup never end (until cancelled); its `long_failure` tool
    raises a message of the given length."""

    def _long_message(self, letter: str) -> str:
        return letter * int(self.task_spec.get("length", 1))

    async def setup(self) -> None:
        if self.task_spec.get("fail") == "setup":
            raise RuntimeError(self._long_message("s"))
        if self.task_spec.get("hang"):
            await asyncio.Event().wait()

    def get_prompt(self) -> list[TextBlock]:
        if self.task_spec.get("fail") == "prompt":
            raise RuntimeError(self._long_message("p"))
        return super().get_prompt()

    @tool
    def long_failure(self, params: LengthInput) -> ToolOutput:
        """Raises an error message of `length` characters."""
        raise RuntimeError("t" * params.length)
