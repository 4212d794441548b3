"""Test environments in the `openreward` dialect, written only against the authoring API.

`tests/interop/test_openreward_differential.py` runs this file under the openreward
server (`openreward.environments.Server`) after changing the one import line
below to `from openreward.environments import ...`, and under `ors-grpc serve`
as is: keep that line the only import of the authoring API.

The tools that matter for the concurrency rules log `start:LABEL` and
`end:LABEL` lines to the file named by the task's `log` (when it has one), and
can hold until the file named by their `hold` input exists, so a test can see
from outside which calls overlap without reading clocks.
"""

from __future__ import annotations

import asyncio
import base64
import os
from typing import Optional

from pydantic import BaseModel

from ors_grpc import (
    Environment,
    GroupCandidate,
    GroupScore,
    ImageBlock,
    ListToolsOutput,
    Message,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolOutput,
    ToolResultBlock,
    ToolSpec,
    Toolset,
    terminal,
    tool,
)

TASKS = [
    {"id": 0, "question": "What is 6 * 7?", "answer": "42"},
    {"id": 1, "question": "What is the capital of France?", "answer": "Paris"},
]
#: A 1x1 transparent PNG, the image the conversation and tool results carry.
PIXEL = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
    )
).decode()
#: How long a held call waits for its `hold` file before giving up.
HOLD_LIMIT_S = 30.0


class Labelled(BaseModel):
    label: str
    hold: Optional[str] = None


class Answer(BaseModel):
    answer: str


class NoteInput(BaseModel):
    text: str


async def _wait_for_file(path: Optional[str]) -> None:
    waited = 0.0
    while path and not os.path.exists(path) and waited < HOLD_LIMIT_S:
        await asyncio.sleep(0.02)
        waited += 0.02


class ConvoEnv(Environment):
    """A conversation-shaped quiz: rich messages, a terminal answer, group scoring."""

    def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        self.notes: list[str] = []

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return TASKS if split == "train" else TASKS[:1]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=self.task_spec["question"])]

    def get_messages(self) -> list[Message]:
        question = self.task_spec["question"]
        return [
            Message(role="system", blocks=[TextBlock(text="Answer in one word.")]),
            Message(
                role="user",
                blocks=[TextBlock(text=question), ImageBlock(data=PIXEL, mimeType="image/png")],
                detail={"turn": 1},
            ),
            Message(
                role="assistant",
                blocks=[
                    ReasoningBlock(text="Let me look it up.", signature="sig-1"),
                    TextBlock(text="Checking my notes."),
                    ToolCallBlock(id="call-1", name="note", input={"text": "lookup", "n": 2**60}),
                ],
            ),
            Message(
                role="user",
                blocks=[
                    ToolResultBlock(
                        tool_call_id="call-1",
                        blocks=[TextBlock(text="noted", detail={"k": 1.0})],
                        detail={"elapsed_ms": 3},
                    ),
                    ToolResultBlock(tool_call_id="call-2", blocks=[TextBlock(text="no such tool")], is_error=True),
                    TextBlock(text="Now answer."),
                ],
            ),
        ]

    def list_task_tools(self) -> ListToolsOutput:
        return ListToolsOutput(tools=[
            ToolSpec(name="hint", description="A hint for this task.", input_schema=None),
        ])

    @tool(shared=False)
    async def hint(self) -> ToolOutput:
        """A hint for this task."""
        return ToolOutput(blocks=[TextBlock(text=f"starts with {self.task_spec['answer'][0]}")])

    def _log(self, line: str) -> None:
        path = self.task_spec.get("log")
        if path:
            with open(path, "a") as log:
                log.write(line + "\n")

    async def _held(self, args: Labelled) -> ToolOutput:
        self._log(f"start:{args.label}")
        await _wait_for_file(args.hold)
        self._log(f"end:{args.label}")
        return ToolOutput(blocks=[TextBlock(text=args.label)])

    @tool(concurrent=True)
    async def peek(self, args: Labelled) -> ToolOutput:
        """Read-only: look at the board (runs alongside other calls)."""
        return await self._held(args)

    @tool
    async def scribble(self, args: Labelled) -> ToolOutput:
        """Write on the board (one call at a time)."""
        return await self._held(args)

    @tool
    async def tally(self, args: Labelled) -> ToolOutput:
        """Count the board (one call at a time, independently of scribble)."""
        return await self._held(args)

    @tool(exclusive=True)
    async def checkpoint(self, args: Labelled) -> ToolOutput:
        """Save the board (waits for every other call, and holds them off)."""
        return await self._held(args)

    @tool
    async def note(self, args: NoteInput) -> ToolOutput:
        """Keep a note."""
        self.notes.append(args.text)
        return ToolOutput(blocks=[TextBlock(text=f"{len(self.notes)} notes")], metadata={"notes": self.notes})

    @terminal
    @tool
    async def answer(self, args: Answer) -> ToolOutput:
        """Submit the final answer."""
        correct = args.answer.strip().lower() == self.task_spec["answer"].lower()
        return ToolOutput(
            blocks=[TextBlock(text="correct" if correct else "wrong")],
            metadata={"given": args.answer},
            reward=1.0 if correct else 0.0,
            finished=True,
        )

    async def score_group(self, candidates: list[GroupCandidate]) -> list:
        """Reward each candidate whose last assistant text holds the answer:
        a GroupScore for the right ones, a bare float for the others."""
        if not candidates:
            raise ValueError("no candidates to score")
        await _wait_for_file(self.task_spec.get("hold_scoring"))
        if any((c.metadata or {}).get("miscount") for c in candidates):
            return [0.5]
        scores: list = []
        for candidate in candidates:
            said = [
                block.text
                for message in candidate.messages
                if message.role == "assistant"
                for block in message.blocks
                if block.type == "text"
            ]
            if said and self.task_spec["answer"].lower() in said[-1].lower():
                scores.append(GroupScore(reward=1.0, metadata={"rank": 1, "echo": candidate.metadata}))
            else:
                scores.append(0.25)
        return scores


class ScratchpadToolset(Toolset):
    """A session toolset: its `note` replaces the environment's, its terminal tool wins."""

    def __init__(self, env: ConvoEnv) -> None:
        # Like openreward's web toolsets: no sandbox needed, so no Toolset.__init__.
        # A task may make it refuse the environment (a ValueError, as a toolset
        # that needs a sandbox does) or break.
        if "refuse_scratchpad" in env.task_spec:
            raise ValueError(env.task_spec["refuse_scratchpad"])
        if "break_scratchpad" in env.task_spec:
            raise RuntimeError(env.task_spec["break_scratchpad"])
        self.env = env

    @classmethod
    def name(cls) -> str:
        return "scratchpad"

    @tool
    async def note(self, args: NoteInput) -> ToolOutput:
        """Keep a note on the scratchpad."""
        return ToolOutput(blocks=[TextBlock(text=f"scratchpad: {args.text}")])

    @tool
    async def erase(self) -> ToolOutput:
        """Erase the scratchpad."""
        return ToolOutput(blocks=[TextBlock(text="erased")])

    @terminal
    @tool
    async def final(self, args: Answer) -> ToolOutput:
        """Hand in the scratchpad's answer."""
        return ToolOutput(blocks=[TextBlock(text=f"final: {args.answer}")], reward=0.5, finished=True)


class PlainEnv(Environment):
    """A prompt-based environment: no messages, terminal tool or group scoring of its own."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return TASKS

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=self.task_spec["question"], detail={"plain": True})]

    @tool
    async def submit(self, args: Answer) -> ToolOutput:
        """Submit an answer."""
        return ToolOutput(blocks=[TextBlock(text="ok")], reward=1.0, finished=True)


class SlowStartEnv(Environment):
    """Setup takes `setup_s` seconds of the task (default 4)."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"id": 0, "question": "Ready?", "setup_s": 4}]

    async def setup(self) -> None:
        await asyncio.sleep(float(self.task_spec.get("setup_s", 4)))

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=self.task_spec["question"])]

    @tool
    async def ping_tool(self) -> ToolOutput:
        """Answer once setup is done."""
        return ToolOutput(blocks=[TextBlock(text="pong")])


class LockerTask(BaseModel):
    question: str
    answer: str
    jam: bool = False


class StrictEnv(Environment):
    """Validates its task spec in the constructor (pydantic), as many
    published environments do; `jam: true` makes `setup()` raise."""

    def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        self.task = LockerTask.model_validate(task_spec)

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"question": "Open the locker?", "answer": "yes"}]

    async def setup(self) -> None:
        if self.task.jam:
            raise RuntimeError("locker jammed is jammed")

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=self.task.question)]

    @tool
    async def open_locker(self) -> ToolOutput:
        """Open the locker."""
        return ToolOutput(blocks=[TextBlock(text="opened")], reward=1.0, finished=True)
