"""The small environment every door of the benchmark serves.

Written against our authoring API; the reference server loads this same file
with ``from ors_grpc import`` replaced by ``from ors import`` (see
``bench/ref_server.py``), so both servers run identical environment code.
"""

import base64
import functools
import os

from pydantic import BaseModel

from ors_grpc import Environment, ImageBlock, Split, TextBlock, ToolOutput, tool

#: Size of the raw image the ``big_image`` tool returns; the benchmark sets it
#: through the environment so that a smoke run can use a small one.
IMAGE_BYTES = int(os.environ.get("ORS_BENCH_IMAGE_BYTES", str(8 * 1024 * 1024)))


@functools.cache
def _image_base64() -> str:
    """Built on first use only: an 8 MiB image held from import would distort
    the idle-session memory figures."""
    return base64.b64encode(os.urandom(IMAGE_BYTES)).decode("ascii")


class StepInput(BaseModel):
    n: int


class SubmitInput(BaseModel):
    answer: int


class BenchEnv(Environment):
    """A counter: ``step`` adds, ``submit`` checks the total and ends the episode."""

    #: Unset: ours decides per function (the default). The ``*-threads`` doors
    #: set ORS_BENCH_SYNC_CODE=threads (sync code always in threads),
    #: the ``*-on-loop`` doors ``loop`` (always on the event loop, as the
    #: reference always runs it; the reference ignores the attribute).
    sync_code_on_loop = {"threads": False, "loop": True}.get(os.environ.get("ORS_BENCH_SYNC_CODE", ""))

    def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec=task_spec, secrets=secrets)
        self.total = 0

    @classmethod
    def list_splits(cls) -> list:
        return [Split(name="train", type="train")]

    @classmethod
    def list_tasks(cls, split: str) -> list:
        return [{"target": 10 + i} for i in range(100)]

    def get_prompt(self) -> list:
        return [TextBlock(text=f"Add numbers until you reach {self.task_spec['target']}.")]

    @tool
    def step(self, params: StepInput) -> ToolOutput:
        """Add n to the running total."""
        self.total += params.n
        return ToolOutput(blocks=[TextBlock(text=f"total={self.total}")])

    @tool
    def submit(self, params: SubmitInput) -> ToolOutput:
        """Submit the final answer; ends the episode."""
        correct = params.answer == self.task_spec["target"]
        return ToolOutput(
            blocks=[TextBlock(text="correct" if correct else "wrong")],
            reward=1.0 if correct else 0.0,
            finished=True,
        )

    @tool
    def big_image(self) -> ToolOutput:
        """Return one large image block (the large-payload measurement)."""
        return ToolOutput(blocks=[ImageBlock(data=_image_base64(), mimeType="image/png")])
