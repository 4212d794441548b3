"""How worker processes are started, handed to the pool: `FreshInterpreters`
(`--workers N`: `python -m ors_grpc._runtime.workers.worker`, a fresh
interpreter, never a fork of the server) or `TemplateForks` (`--isolation
episode`: forks of a template process that imported the environments once).
docs/workers.md says why these two and not multiprocessing."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Optional, Protocol, Union

from ors_grpc._runtime.workers.forking import ForkedProcess, TemplateProcess
from ors_grpc._runtime.workers.hop import Setup
from ors_grpc._runtime.workers.startup import worker_environment

__all__ = ["FreshInterpreters", "ProcessHandle", "Spawner", "TemplateForks", "pid_of"]

#: A worker process as the pool handles it: Popen's pid, poll, wait, kill and returncode.
ProcessHandle = Union["subprocess.Popen[bytes]", ForkedProcess]


class Spawner(Protocol):
    """Starts worker processes for the pool."""

    @property
    def up(self) -> bool:
        """Whether `spawn` can start a process now."""

    async def start(self, setup: Setup, on_lost: Callable[[], None]) -> None:
        """Make ready to spawn (WorkerStartupError when it cannot); `on_lost` is called when it stops being."""

    def spawn(self, worker_id: int, socket_path: str) -> ProcessHandle:
        """A process that will serve as worker `worker_id` on the hop at `socket_path`."""

    def lost(self) -> list[tuple[int, Optional[int], float]]:
        """What ended since the last call, as (pid, exit status, when it had started): the pool reaps it."""

    async def revive(self, now: float) -> None:
        """Be `up` again after a loss (WorkerStartupError when it cannot)."""

    async def stop(self) -> None:
        """Release what `start` took, after every worker process ended."""


class FreshInterpreters:
    """Each worker a fresh interpreter (fork and exec at once)."""

    up = True

    async def start(self, setup: Setup, on_lost: Callable[[], None]) -> None:
        pass

    def spawn(self, worker_id: int, socket_path: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "ors_grpc._runtime.workers.worker", socket_path, str(worker_id), str(os.getpid())],
            stdin=subprocess.DEVNULL, env=worker_environment(),
        )

    def lost(self) -> list[tuple[int, Optional[int], float]]:
        return []

    async def revive(self, now: float) -> None:
        pass

    async def stop(self) -> None:
        pass


class TemplateForks:
    """Each worker a fork of the template process. If the template dies, its
    children die with it; `revive` starts another."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._template: Optional[TemplateProcess] = None
        self._setup: Optional[Setup] = None
        self._on_lost: Callable[[], None] = lambda: None
        self._lost: list[tuple[int, Optional[int], float]] = []

    @property
    def up(self) -> bool:
        return self._template is not None and self._template.alive

    async def start(self, setup: Setup, on_lost: Callable[[], None]) -> None:
        self._setup, self._on_lost = setup, on_lost
        await self.revive(self._clock())

    async def revive(self, now: float) -> None:
        assert self._setup is not None
        template = TemplateProcess(self._setup, self._template_lost, now)
        await template.start()
        self._template = template

    def spawn(self, worker_id: int, socket_path: str) -> ForkedProcess:
        assert self._template is not None
        return self._template.fork(worker_id, socket_path)

    def _template_lost(self, template: TemplateProcess) -> None:
        assert template.process is not None
        self._lost.append((template.process.pid, template.process.returncode, template.started_at))
        self._on_lost()

    def lost(self) -> list[tuple[int, Optional[int], float]]:
        lost, self._lost = self._lost, []
        return lost

    async def stop(self) -> None:
        if self._template is not None:
            await self._template.stop()


async def pid_of(process: ProcessHandle) -> Optional[int]:
    """A worker process's pid (a forked one's once the template has said it; None if it never forked it)."""
    if isinstance(process, ForkedProcess):
        await process.forked.wait()
    return process.pid
