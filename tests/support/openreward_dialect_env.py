"""An environment in the openreward dialect (openreward >= 0.1.157), written only against the authoring API.

Tests also run this file under `openreward.environments`, after changing the
one import line below to `from openreward.environments import ...`: keep that
line the only import of the authoring API, and use nothing openreward lacks.

It uses every openreward addition: concurrent and exclusive tools, a
`@terminal` tool, rich `get_messages` (no `get_prompt`: the prompt is the
messages flattened), `score_group`, a declared toolset and a toolset to
attach by name. Tools named `wait_*` let tests steer the concurrency rules
without timing: each records that it entered, then waits until the test
releases its tag (`release`), in the same process and event loop; or, when
the tools run in another process (`serve --workers`), through files in the
folder named by STEERING_DIR_VARIABLE (`entered_in`, `release_in`).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel

from ors_grpc import (Environment, GroupScore, Message, ReasoningBlock, TextBlock, ToolCallBlock, ToolOutput,
                      ToolResultBlock, Toolset, terminal, tool)

#: Tags of the `wait_*` calls that entered their tool, in order.
ENTERED: list[str] = []
_RELEASES: dict[str, asyncio.Event] = {}
#: A folder, when the tools run in another process than the test: a call that enters leaves
#: `entered-TAG` there, and a `wait_*` call waits for `release-TAG`.
STEERING_DIR_VARIABLE = "ORS_TEST_STEERING_DIR"
#: Seconds between two looks for a release file.
_RELEASE_POLL_S = 0.01


def _release_event(tag: str) -> asyncio.Event:
    return _RELEASES.setdefault(tag, asyncio.Event())


def release(tag: str) -> None:
    """Let the `wait_*` call of `tag` return (also before it started)."""
    _release_event(tag).set()


def reset() -> None:
    ENTERED.clear()
    _RELEASES.clear()


def entered_in(folder: Path) -> set[str]:
    """The tags of the calls that entered, steered through `folder`."""
    return {path.name.removeprefix("entered-") for path in folder.glob("entered-*")}


def release_in(folder: Path, tag: str) -> None:
    """Let the `wait_*` call of `tag`, steered through `folder`, return (also before it started)."""
    (folder / f"release-{tag}").touch()


def _enter(tag: str) -> None:
    ENTERED.append(tag)
    folder = os.environ.get(STEERING_DIR_VARIABLE)
    if folder:
        Path(folder, f"entered-{tag}").touch()


class Tag(BaseModel):
    tag: str


class Answer(BaseModel):
    answer: str


async def _wait(tag: str, kind: str) -> ToolOutput:
    _enter(tag)
    folder = os.environ.get(STEERING_DIR_VARIABLE)
    if folder:
        while not Path(folder, f"release-{tag}").exists():
            await asyncio.sleep(_RELEASE_POLL_S)
    else:
        await _release_event(tag).wait()
    return ToolOutput(blocks=[TextBlock(text=f"{kind} {tag} done")])


class HelperToolset(Toolset):
    """Declared by the environment: its tools join the environment's."""

    def __init__(self, env: Environment) -> None:
        self.env = env  # no sandbox (openreward's base class would require one)

    @tool(concurrent=True)
    async def lookup(self, params: Tag) -> ToolOutput:
        """Look a tag up (read-only)."""
        return ToolOutput(blocks=[TextBlock(text=f"found {params.tag}")])

    @tool(shared=False)
    async def clash(self) -> ToolOutput:
        """Also defined by the environment: calling it is a name collision."""
        return ToolOutput(blocks=[TextBlock(text="toolset clash")])


class GraderToolset(Toolset):
    """Registered with the server and attached by name: its terminal tool
    replaces the environment's, its `wait_read` the environment's."""

    def __init__(self, env: Environment) -> None:
        self.env = env

    @terminal
    @tool
    async def grade(self) -> ToolOutput:
        """Grade from the environment's state."""
        return ToolOutput(blocks=[TextBlock(text="graded")], reward=0.5, finished=True)

    @tool(concurrent=True)
    async def wait_read(self, params: Tag) -> ToolOutput:
        """The toolset's own read."""
        return await _wait(params.tag, "toolset read")

    @tool
    async def toolset_echo(self, params: Answer) -> ToolOutput:
        """Echo through the toolset."""
        return ToolOutput(blocks=[TextBlock(text=f"toolset {params.answer}")])


class OpenRewardEnv(Environment):
    """Questions answered by a final plain message, graded by the terminal tool."""

    toolsets = [HelperToolset]

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"question": "What is 2+2?", "answer": "4"}, {"question": "Capital of France?", "answer": "Paris"}]

    def get_messages(self) -> list[Message]:
        question = self.task_spec["question"]
        return [
            Message(role="system", blocks=[TextBlock(text="Answer briefly.")]),
            Message(role="user", blocks=[TextBlock(text=question)], detail={"turn": 1}),
            Message(role="assistant", blocks=[
                ReasoningBlock(text="Let me look it up.", signature="sig-1"),
                ToolCallBlock(id="call-1", name="lookup", input={"tag": "q", "n": 2**70}),
            ]),
            Message(role="user", blocks=[
                ToolResultBlock(tool_call_id="call-1", blocks=[TextBlock(text="found q")]),
                TextBlock(text="Now answer."),
            ]),
        ]

    @tool(concurrent=True)
    async def wait_read(self, params: Tag) -> ToolOutput:
        """Read something; many may run at once."""
        return await _wait(params.tag, "read")

    @tool
    async def wait_step(self, params: Tag) -> ToolOutput:
        """Take a step; steps take turns."""
        return await _wait(params.tag, "step")

    @tool(exclusive=True)
    async def wait_commit(self, params: Tag) -> ToolOutput:
        """Commit; runs alone."""
        return await _wait(params.tag, "commit")

    @tool
    async def clash(self) -> ToolOutput:
        """Also defined by the helper toolset."""
        return ToolOutput(blocks=[TextBlock(text="env clash")])

    @tool(shared=False)
    async def hint(self) -> ToolOutput:
        """A task-specific hint."""
        return ToolOutput(blocks=[TextBlock(text=f"starts with {self.task_spec['answer'][0]}")])

    @terminal
    @tool
    async def submit(self, params: Answer) -> ToolOutput:
        """Submit the final answer."""
        correct = params.answer.strip() == self.task_spec["answer"]
        _enter("submit")
        return ToolOutput(blocks=[TextBlock(text="correct" if correct else "wrong")],
                          reward=1.0 if correct else 0.0, finished=True)

    async def score_group(self, candidates):
        # Candidate metadata steers it: {"wait": tag} waits for `release(tag)`,
        # {"fail": ...} raises, {"drop": ...} miscounts.
        for candidate in candidates:
            if (candidate.metadata or {}).get("wait"):
                await _wait(candidate.metadata["wait"], "score")
        if any((c.metadata or {}).get("fail") for c in candidates):
            raise RuntimeError("judge unavailable")
        scores = []
        for candidate in candidates:
            text = " ".join(b.text for b in candidate.messages[-1].blocks if b.type == "text")
            reward = 1.0 if text.strip() == self.task_spec["answer"] else 0.0
            scores.append(reward if candidate.metadata is None else GroupScore(reward=reward, metadata=candidate.metadata))
        if any((c.metadata or {}).get("drop") for c in candidates):
            scores.pop()
        return scores
