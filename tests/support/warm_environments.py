"""Environments for the warm-episode tests: their setups and teardowns are observable.

Every setup and teardown is numbered and recorded in `EVENTS` (for a server
in the test's process) and, when the environment variable ORS_TEST_MARKER_DIR
names a folder, as a line of its `events` file (for a `serve` subprocess,
whose worker processes all number their setups in that one file). The prompt names the setup that built the
episode, so a client can tell a claimed prepared episode from a fresh one.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

from pydantic import BaseModel

from ors_grpc import Environment, TextBlock, ToolOutput, tool

MARKER_DIR_VARIABLE = "ORS_TEST_MARKER_DIR"
#: ("setup" | "teardown", task tag, setup number), in order.
EVENTS: list[tuple[str, str, int]] = []


def _record(kind: str, tag: str, number: int) -> None:
    EVENTS.append((kind, tag, number))
    folder = os.environ.get(MARKER_DIR_VARIABLE)
    if folder:
        with open(Path(folder, "events"), "a", encoding="utf-8") as events:
            events.write(f"{kind} {tag} {number}\n")


def _record_setup(tag: str) -> int:
    """Record a setup; its number, counted over the whole server: in the events file when there
    is one (every process of a `serve`, worker processes included, appends to it, one at a time
    under a lock), else in this process."""
    folder = os.environ.get(MARKER_DIR_VARIABLE)
    if not folder:
        number = sum(1 for kind, _, _ in EVENTS if kind == "setup") + 1
        EVENTS.append(("setup", tag, number))
        return number
    with open(Path(folder, "events"), "a+", encoding="utf-8") as events:
        fcntl.flock(events, fcntl.LOCK_EX)  # released when the file closes
        events.seek(0)
        number = sum(1 for line in events if line.startswith("setup ")) + 1
        events.write(f"setup {tag} {number}\n")
    EVENTS.append(("setup", tag, number))
    return number


def read_events(folder: Path) -> list[tuple[str, str, int]]:
    """The events a `serve` subprocess recorded under `folder`."""
    path = Path(folder, "events")
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [(kind, tag, int(number)) for kind, tag, number in (line.split() for line in lines)]


class NoteInput(BaseModel):
    text: str


class WarmEnv(Environment):
    """Its setup takes `setup_s` seconds of the task spec (default 0.2) and is numbered."""

    def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        self.tag = str(task_spec.get("tag"))
        self.setup_number = 0

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"tag": f"indexed-{index}"} for index in range(4)]

    async def setup(self) -> None:
        await asyncio.sleep(float(self.task_spec.get("setup_s", 0.2)))
        self.setup_number = _record_setup(self.tag)

    def teardown(self) -> None:
        _record("teardown", self.tag, self.setup_number)

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"setup {self.setup_number} of {self.tag}")]

    @tool
    def note(self, params: NoteInput) -> ToolOutput:
        """Answers the note back."""
        return ToolOutput(blocks=[TextBlock(text=params.text)])


class FailingWarmEnv(WarmEnv):
    """Its setup raises after a moment."""

    async def setup(self) -> None:
        await asyncio.sleep(0.1)
        raise RuntimeError(f"setup of {self.tag} exploded")
