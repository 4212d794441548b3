"""Environments for the worker-mode tests (`serve --workers N`): what the tests
need to see (which process ran a call, where its sync code ran) travels in
tool outputs, log lines and spans."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path

from opentelemetry import trace

from ors_grpc import Environment, TextBlock, ToolOutput, tool
from tests.support.reliability_environments import MARKER_DIR_VARIABLE, ProbeEnv

logger = logging.getLogger(__name__)
#: The environment's own tracer (the OpenTelemetry API's global one), as environment code gets one.
tracer = trace.get_tracer(__name__)
#: The attribute of the environment's spans that names the process that made them.
PID_ATTRIBUTE = "probe.pid"

#: A file whose existence keeps worker processes from importing this module (a crash loop).
POISON_VARIABLE = "ORS_TEST_WORKER_POISON"

#: The program of a worker process, or of the template that episode processes are forked from.
WORKER_PROGRAMS = ("worker.py", "template.py")

if sys.argv[0].endswith(WORKER_PROGRAMS) and Path(os.environ.get(POISON_VARIABLE) or "/nonexistent").exists():
    raise RuntimeError("poisoned: this worker cannot start")

#: The process that imported this module (for an episode process forked from a template: the template).
IMPORTED_IN = os.getpid()


class WorkerProbeEnv(ProbeEnv):
    """ProbeEnv whose tools also say which process runs them; its setup and its
    `traced*` tools open spans of their own, its `log_tag` tool logs."""

    def setup(self) -> None:
        with tracer.start_as_current_span("probe.setup", attributes={PID_ATTRIBUTE: os.getpid()}):
            pass

    @tool
    async def traced(self) -> ToolOutput:
        """Opens a span (from an async tool, on the event loop)."""
        with tracer.start_as_current_span("probe.async_work", attributes={PID_ATTRIBUTE: os.getpid()}):
            return ToolOutput(blocks=[])

    @tool
    def traced_sync(self) -> ToolOutput:
        """Opens a span (from a sync tool: in a thread at first)."""
        with tracer.start_as_current_span("probe.sync_work", attributes={PID_ATTRIBUTE: os.getpid()}):
            return ToolOutput(blocks=[])

    @tool
    def log_tag(self) -> ToolOutput:
        """Logs one WARNING line naming the episode's tag."""
        logger.warning("probe_log tag=%s", self.task_spec.get("tag"))
        return ToolOutput(blocks=[])

    @tool
    def pid(self) -> ToolOutput:
        """The id of the process running this episode's code."""
        return ToolOutput(blocks=[], metadata={"pid": os.getpid()})

    @tool
    def importer_pid(self) -> ToolOutput:
        """The id of the process that imported this environment's module."""
        return ToolOutput(blocks=[], metadata={"pid": IMPORTED_IN})

    @tool
    def exit_process(self) -> ToolOutput:
        """Ends the process running the episode at once, as a native library's abort does."""
        os._exit(3)

    @tool
    def block_thread(self) -> ToolOutput:
        """A sync call that never returns (it runs in a user-code thread once it is found slow)."""
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
    async def block_loop(self) -> ToolOutput:
        """Blocks its process's event loop for an hour (a sync sleep in an async tool), once it has left
        a marker file `blocking-<tag>` saying so: only a signal ends the process meanwhile."""
        Path(os.environ[MARKER_DIR_VARIABLE], f"blocking-{self.task_spec.get('tag')}").write_text("")
        time.sleep(3600)
        return ToolOutput(blocks=[])

    @tool
    def spin(self) -> ToolOutput:
        """A sync call that computes forever (it runs in a user-code thread once it is found slow)."""
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


def where_sync_code_runs() -> str:
    """Where sync code runs now: on the event loop, or in a thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return "thread"
    return "loop"


class LoopPinnedEnv(ProbeEnv):
    """All its sync code on the event loop (`sync_code_on_loop = True`); its
    `where` tool says where each kind of that code ran in the episode."""

    sync_code_on_loop = True

    def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        self.ran_in = {"constructor": where_sync_code_runs()}

    def setup(self) -> None:
        self.ran_in["setup"] = where_sync_code_runs()

    def get_prompt(self):
        self.ran_in["get_prompt"] = where_sync_code_runs()
        return super().get_prompt()

    @tool
    def where(self) -> ToolOutput:
        """Where the constructor, setup, prompt and this tool ran: `loop` or `thread`."""
        self.ran_in["tool"] = where_sync_code_runs()
        return ToolOutput(blocks=[], metadata=self.ran_in)


class ThreadPinnedEnv(LoopPinnedEnv):
    """All its sync code in threads (`sync_code_on_loop = False`)."""

    sync_code_on_loop = False


class NoLifecycleEnv(Environment):
    """Defines neither `setup()` nor `teardown()`: the server sends neither step to its worker."""

    @classmethod
    def list_splits(cls) -> list:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list:
        return [{}]

    def get_prompt(self) -> list:
        return [TextBlock(text="nothing to set up")]

    @tool
    def ping(self) -> ToolOutput:
        """Answers pong."""
        return ToolOutput(blocks=[TextBlock(text="pong")])

    @tool
    async def timed(self) -> ToolOutput:
        """Runs under asyncio.timeout, which needs the current task (as anyio, httpx's, does)."""
        async with asyncio.timeout(5):
            await asyncio.sleep(0)
        return ToolOutput(blocks=[TextBlock(text=asyncio.current_task().get_name())])


class InstanceSetupEnv(NoLifecycleEnv):
    """Sets its own `setup()` on the instance (no class defines one): it runs, in a worker as in-process."""

    def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec=task_spec, secrets=secrets)
        self.was_set_up = False
        self.setup = self._set_up

    def _set_up(self) -> None:
        self.was_set_up = True

    @tool
    def set_up(self) -> ToolOutput:
        """Says whether `setup()` ran."""
        return ToolOutput(blocks=[TextBlock(text=str(self.was_set_up))])
