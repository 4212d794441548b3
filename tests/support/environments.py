"""Test environments, written only against the authoring API.

The differential test runs this file under the reference SDK too, after
changing the one import line below to `from ors import ...`: keep that line
the only import of the authoring API, and use nothing the reference lacks.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time

from pydantic import BaseModel

from ors_grpc import Environment, ImageBlock, ListToolsOutput, TextBlock, ToolOutput, ToolSpec, tool

TRAIN_TASKS = [
    {"id": 0, "question": "Say hello", "answer": "hello", "big": 2**70, "ratio": 1.0},
    {"id": 1, "question": "Say world", "answer": "world", "nested": {"z": 1, "a": [1, 2.5, "ü"]}},
    {"id": 2, "question": "Say 42", "answer": "42", "unicode": "héllo wörld ✓ 😀"},
]
TEST_TASKS = [
    {"id": 3, "question": "Say yes", "answer": "yes"},
    {"id": 4, "question": "Say no", "answer": "no"},
]


def image_bytes(size: int) -> bytes:
    """The `size` raw bytes the `image` tool returns: 0, 1, ..., 255, 0, 1, ..."""
    return (bytes(range(256)) * (size // 256 + 1))[:size]


class EchoInput(BaseModel):
    text: str


class AddInput(BaseModel):
    a: int
    b: int


class SubmitInput(BaseModel):
    answer: str


class SleepInput(BaseModel):
    seconds: float


class BigInput(BaseModel):
    chars: int


class ImageInput(BaseModel):
    size: int


class EchoEnv(Environment):
    """A toolbox environment for tests."""

    def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        self.secret_names = sorted(secrets)

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return {"train": TRAIN_TASKS, "test": TEST_TASKS}[split]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=str(self.task_spec.get("question", "no question")))]

    def list_task_tools(self) -> ListToolsOutput:
        if self.task_spec.get("id") == 0:
            return ListToolsOutput(tools=[
                ToolSpec(name="hint", description="A hint for task 0.", input_schema=None)
            ])
        return ListToolsOutput(tools=[])

    @tool
    def echo(self, params: EchoInput) -> ToolOutput:
        """Echo the text back."""
        return ToolOutput(blocks=[TextBlock(text=params.text)])

    @tool
    async def add(self, params: AddInput) -> ToolOutput:
        """Add two integers."""
        return ToolOutput(blocks=[TextBlock(text=str(params.a + params.b))], reward=0.0)

    @tool
    def submit(self, params: SubmitInput) -> ToolOutput:
        """Submit an answer; ends the episode."""
        correct = params.answer == self.task_spec.get("answer")
        return ToolOutput(
            blocks=[TextBlock(text="correct" if correct else "wrong")],
            reward=1.0 if correct else 0.0,
            finished=True,
        )

    @tool
    def fail(self) -> ToolOutput:
        """Always raises."""
        raise RuntimeError("boom")

    @tool
    async def sleep(self, params: SleepInput) -> ToolOutput:
        """Sleep, then answer."""
        await asyncio.sleep(params.seconds)
        return ToolOutput(blocks=[TextBlock(text="slept")])

    @tool
    def big(self, params: BigInput) -> ToolOutput:
        """One text block of `chars` characters."""
        return ToolOutput(blocks=[TextBlock(text="x" * params.chars)])

    @tool
    def image(self, params: ImageInput) -> ToolOutput:
        """One PNG-typed image block of `size` raw bytes."""
        raw = image_bytes(params.size)
        return ToolOutput(blocks=[ImageBlock(
            data=base64.b64encode(raw).decode("ascii"), mimeType="image/png", detail={"size": params.size}
        )])

    @tool
    def metadata(self) -> ToolOutput:
        """Metadata that needs a lossless JSON hop."""
        return ToolOutput(
            blocks=[TextBlock(text="meta", detail={"b": 1, "a": 1.0})],
            metadata={"big": 2**70, "float": 1.0, "unicode": "ünïcödé ✓", "nested": {"z": [1, 2.0], "a": None}},
        )

    @tool
    def secret(self) -> ToolOutput:
        """The names (never the values) of the secrets received."""
        return ToolOutput(blocks=[TextBlock(text="secret:" + str(self.secret_names))])

    @tool(shared=False)
    def hint(self) -> ToolOutput:
        """A task-specific tool (listed by list_task_tools on train task 0)."""
        return ToolOutput(blocks=[TextBlock(text="the answer is " + str(self.task_spec.get("answer")))])


class SlowSetupEnv(EchoEnv):
    """EchoEnv whose setup takes a moment."""

    async def setup(self) -> None:
        await asyncio.sleep(0.3)


class FailingSetupEnv(EchoEnv):
    """EchoEnv whose setup raises."""

    def setup(self) -> None:
        raise RuntimeError("setup exploded")


class TeardownRecordingEnv(EchoEnv):
    """EchoEnv whose teardown appends a line to the file named by the
    environment variable ORS_TEST_TEARDOWN_FILE (to observe another process)."""

    def teardown(self) -> None:
        path = os.environ.get("ORS_TEST_TEARDOWN_FILE")
        if path:
            with open(path, "a", encoding="utf-8") as record:
                record.write(f"teardown {self.task_spec.get('id')}\n")


class BlockingToolEnv(EchoEnv):
    """EchoEnv with a synchronous tool that blocks its thread for a while."""

    @tool
    def block(self, params: SleepInput) -> ToolOutput:
        """Block the calling thread, then answer."""
        time.sleep(params.seconds)
        return ToolOutput(blocks=[TextBlock(text="unblocked")])
