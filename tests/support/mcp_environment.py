"""The environment the MCP door's tests serve: the test toolbox (`EchoEnv`:
add, image, sleep, submit, ...) with a terminal tool, a conversation, and a
tool answering as a call whose worker process died under it."""

from __future__ import annotations

import asyncio

import signal

from ors_grpc import Message, TextBlock, ToolOutput, terminal, tool
from ors_grpc.protocol.errors import environment_crashed_from_exitcode
from tests.support.environments import EchoEnv, SubmitInput

#: The task the orchestrator creates in these tests.
TASK = {"question": "What is 2+3?", "answer": "5"}


class McpEnv(EchoEnv):
    """EchoEnv with a terminal `answer` tool and messages: a system turn, then the question."""

    async def setup(self) -> None:
        """As long as the task's `setup_seconds` (none by default): a slow setup, when a test needs one."""
        await asyncio.sleep(float(self.task_spec.get("setup_seconds", 0)))

    def get_messages(self) -> list[Message]:
        return [Message(role="system", blocks=[TextBlock(text="Answer with a number.")]),
                Message(role="user", blocks=[TextBlock(text=str(self.task_spec.get("question")))])]

    @terminal
    @tool
    def answer(self, params: SubmitInput) -> ToolOutput:
        """Give the final answer; ends the episode."""
        correct = params.answer.strip() == self.task_spec.get("answer")
        return ToolOutput(blocks=[TextBlock(text="correct" if correct else "wrong")],
                          reward=1.0 if correct else 0.0, finished=True)

    @tool
    def crash_in_flight(self) -> ToolOutput:
        """Answers as a call whose worker process died under it (CrashReportEnv's)."""
        raise environment_crashed_from_exitcode(-signal.SIGSEGV)
