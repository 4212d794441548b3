"""Environments for the worker-mode tests (`serve --workers N`): what the tests
need to see (which process ran a call) travels in tool outputs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ors_grpc import ToolOutput, tool
from tests.support.reliability_environments import ProbeEnv

#: A file whose existence keeps worker processes from importing this module (a crash loop).
POISON_VARIABLE = "ORS_TEST_WORKER_POISON"

if sys.argv[0].endswith("worker.py") and Path(os.environ.get(POISON_VARIABLE) or "/nonexistent").exists():
    raise RuntimeError("poisoned: this worker cannot start")


class WorkerProbeEnv(ProbeEnv):
    """ProbeEnv whose tools also say which process runs them."""

    @tool
    def pid(self) -> ToolOutput:
        """The id of the process running this episode's code."""
        return ToolOutput(blocks=[], metadata={"pid": os.getpid()})

    @tool
    def exit_process(self) -> ToolOutput:
        """Ends the process running the episode at once, as a native library's abort does."""
        os._exit(3)

    @tool
    def block_thread(self) -> ToolOutput:
        """A sync call that never returns (it runs in a worker thread once it is found slow)."""
        import threading

        threading.Event().wait()
        return ToolOutput(blocks=[])

    @tool
    def segfault(self) -> ToolOutput:
        """Reads address 0: the process dies of SIGSEGV, as with a native library's bug."""
        import ctypes

        ctypes.string_at(0)
        return ToolOutput(blocks=[])

    @tool
    def spin(self) -> ToolOutput:
        """A sync call that computes forever (it runs in a worker thread once it is found slow)."""
        while True:
            pass

    @tool
    def hoard_memory(self) -> ToolOutput:
        """Takes 300 MiB and keeps it (a leak), then waits for ever: only the memory limit ends the call."""
        import threading

        self.hoard = bytearray(300 * 1024 * 1024)
        for offset in range(0, len(self.hoard), 4096):
            self.hoard[offset] = 1  # touch every page: resident, not just reserved
        threading.Event().wait()
        return ToolOutput(blocks=[])
