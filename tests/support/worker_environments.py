"""Environments for the worker-mode tests (`serve --workers N`): what the tests
need to see (which process ran a call) travels in tool outputs."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from ors_grpc import ToolOutput, tool
from tests.support.reliability_environments import MARKER_DIR_VARIABLE, ProbeEnv

#: A file whose existence keeps worker processes from importing this module (a crash loop), once set.
POISON_VARIABLE = "ORS_TEST_WORKER_POISON"

#: The program of a worker process, or of the template that episode processes are forked from.
WORKER_PROGRAMS = ("worker.py", "template.py")

if sys.argv[0].endswith(WORKER_PROGRAMS) and Path(os.environ.get(POISON_VARIABLE) or "/nonexistent").exists():
    raise RuntimeError("poisoned: this worker cannot start")

#: The process that imported this module (for an episode process forked from a template: the template).
IMPORTED_IN = os.getpid()


class WorkerProbeEnv(ProbeEnv):
    """ProbeEnv whose tools also say which process runs them."""

    @tool
    def pid(self) -> ToolOutput:
        """The id of the process running this episode's code."""
        return ToolOutput(blocks=[], metadata={"pid": os.getpid()})

    @tool
    def importer_pid(self) -> ToolOutput:
        """The id of the process that imported this environment's module."""
        return ToolOutput(blocks=[], metadata={"pid": IMPORTED_IN})

    @tool
    def log_line(self) -> ToolOutput:
        """Logs one WARNING naming the episode's tag."""
        logging.getLogger("tests.worker_probe").warning("probe_log_line tag=%s", self.task_spec.get("tag"))
        return ToolOutput(blocks=[])

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
    async def block_loop(self) -> ToolOutput:
        """Blocks its process's event loop for an hour (a sync sleep in an async tool), once it has left
        a marker file `blocking-<tag>` saying so: only a signal ends the process meanwhile."""
        Path(os.environ[MARKER_DIR_VARIABLE], f"blocking-{self.task_spec.get('tag')}").write_text("")
        time.sleep(3600)
        return ToolOutput(blocks=[])

    @tool
    def hoard_memory(self) -> ToolOutput:
        """Takes 300 MiB and keeps it (a leak), then answers."""
        self.hoard = bytearray(300 * 1024 * 1024)
        for offset in range(0, len(self.hoard), 4096):
            self.hoard[offset] = 1  # touch every page: resident, not just reserved
        return ToolOutput(blocks=[])

    @tool
    def poison_and_exit(self) -> ToolOutput:
        """Keeps every new worker from starting (the poison file), then ends this one."""
        Path(os.environ[POISON_VARIABLE]).write_text("poison")
        os._exit(1)
