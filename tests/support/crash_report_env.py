"""An environment whose prompt answers ENVIRONMENT_CRASHED, as a host whose
worker process died does: it stands in for worker mode, so that the reason's
mapping is checked through the real service and both of its doors now. (An
ORSError raised by environment code passes through the service unchanged.)"""

from __future__ import annotations

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
