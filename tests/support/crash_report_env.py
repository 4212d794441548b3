"""An environment whose prompt, and two tools, answer ENVIRONMENT_CRASHED, as
a host whose worker process died does (under the call, for the tools): it
stands in for a real death, so that the reason's mapping is checked through
the real service, every door and every client, in any mode. (An ORSError
raised by environment code passes through the service unchanged.)"""

from __future__ import annotations

import asyncio
import signal

from ors_grpc import Environment, TextBlock, ToolOutput, tool
from ors_grpc.protocol.errors import environment_crashed_from_exitcode


class CrashReportEnv(Environment):
    """`get_prompt` reports the death by SIGSEGV of its (imagined) worker process."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"id": 0}]

    def get_prompt(self) -> list[TextBlock]:
        raise environment_crashed_from_exitcode(-signal.SIGSEGV)

    @tool
    def noop(self) -> ToolOutput:
        """Does nothing."""
        return ToolOutput(blocks=[TextBlock(text="ok")], reward=0.0, finished=False)

    @tool
    def crash_in_flight(self) -> ToolOutput:
        """Answers as a call whose worker process died under it (at once)."""
        raise environment_crashed_from_exitcode(-signal.SIGSEGV)

    @tool
    async def crash_in_flight_later(self) -> ToolOutput:
        """The same, after a while: the HTTP door has begun its answer by then."""
        await asyncio.sleep(0.3)
        raise environment_crashed_from_exitcode(-signal.SIGSEGV)
