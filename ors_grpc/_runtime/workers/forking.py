"""The server's end of the template process (`template`, `--isolation
episode`): `TemplateProcess` starts it (the environments imported there),
asks it for a fork per episode process, and hears how each ended, which only
its parent can learn; `ForkedProcess` is such a child as the pool handles a
process (Popen's pid, poll, wait, kill, returncode)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Callable, Optional

from ors_grpc._runtime.workers.hop import Exited, Fork, Forked, Ready, Setup, read_frame, write_frame
from ors_grpc._runtime.workers.startup import WORKER_START_TIMEOUT_S, WorkerStartupError, worker_environment
from ors_grpc.protocol.errors import exit_text

__all__ = ["ForkedProcess", "TemplateProcess"]

logger = logging.getLogger("ors_grpc.workers")


class ForkedProcess:
    """An episode process forked by the template: its pid and exit status come from the template, its parent."""

    def __init__(self) -> None:
        self.pid: Optional[int] = None
        self.returncode: Optional[int] = None
        #: Set once the template forked it (`pid`), or ended without doing so.
        self.forked = asyncio.Event()
        self._ended = threading.Event()
        self._kill_once_forked = False

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self) -> Optional[int]:
        """Its exit status, once the template reported it (blocks: call it in a thread, as Popen.wait)."""
        self._ended.wait()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is not None:
            return
        if self.pid is None:
            self._kill_once_forked = True
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # ended; the template's report is on its way

    def set_pid(self, pid: int) -> None:
        self.pid = pid
        self.forked.set()
        if self._kill_once_forked:
            self.kill()

    def set_ended(self, status: int) -> None:
        self.returncode = status
        self._ended.set()
        self.forked.set()


class TemplateProcess:
    """The template process: started once, with the environments imported
    in it; forks a process per request; reports how each one ended."""

    def __init__(self, setup: Setup, on_lost: Callable[[TemplateProcess], None], started_at: float) -> None:
        self._setup = setup
        self._on_lost = on_lost
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.started_at = started_at
        self.alive = False
        self._writer: Optional[asyncio.StreamWriter] = None
        self._reading: Optional[asyncio.Task[None]] = None
        self._stopping = False
        #: Forks asked for and not answered yet, by worker id; forked processes not reaped yet, by pid.
        self._forking: dict[int, ForkedProcess] = {}
        self._children: dict[int, ForkedProcess] = {}

    async def start(self) -> None:
        """Start it; WorkerStartupError (with the traceback) when it cannot import the environments."""
        server_end, template_end = socket.socketpair()
        with template_end:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ors_grpc._runtime.workers.template", str(template_end.fileno()),
                 str(os.getpid())],
                stdin=subprocess.DEVNULL, env=worker_environment(), pass_fds=[template_end.fileno()],
            )
        try:
            reader, self._writer = await asyncio.open_unix_connection(sock=server_end)
            write_frame(self._writer, self._setup)
            ready: Ready = await asyncio.wait_for(read_frame(reader), WORKER_START_TIMEOUT_S)
        except asyncio.TimeoutError:
            await self._kill()
            raise WorkerStartupError(
                f"the template process did not start within {WORKER_START_TIMEOUT_S:g}s") from None
        except (asyncio.IncompleteReadError, ConnectionError):
            await self._kill()
            raise WorkerStartupError(
                f"the template process {exit_text(self.process.returncode)} while starting") from None
        except BaseException:
            await self._kill()
            raise
        if ready.error:
            await self._kill()
            raise WorkerStartupError(f"the template process could not import the environments:\n{ready.error.rstrip()}")
        self.alive = True
        self._reading = asyncio.get_running_loop().create_task(self._read_forever(reader), name="ors-episode-template")
        logger.info("episode_template_started pid=%d", self.process.pid)

    def fork(self, worker_id: int, socket_path: str) -> ForkedProcess:
        """A process forked to serve as worker `worker_id` on the hop at `socket_path` (the template is alive)."""
        assert self.alive and self._writer is not None
        process = self._forking[worker_id] = ForkedProcess()
        write_frame(self._writer, Fork(worker_id, socket_path))
        return process

    async def _read_forever(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                message: Forked | Exited = await read_frame(reader)
                if isinstance(message, Forked):
                    process = self._children[message.pid] = self._forking.pop(message.worker_id)
                    process.set_pid(message.pid)
                else:
                    process = self._children.pop(message.pid, None)
                    if process is not None:  # (else a process an environment's import started: not ours)
                        process.set_ended(message.status)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.alive = False
            for process in [*self._forking.values(), *self._children.values()]:
                process.set_ended(-signal.SIGKILL)  # their death signal, from the template's end (see `template`)
            self._forking.clear()
            self._children.clear()
            if not self._stopping:
                assert self.process is not None
                await asyncio.to_thread(self.process.wait)
                self._on_lost(self)

    async def stop(self) -> None:
        """End it, once its children have ended: closing its socket ends it (and would kill them)."""
        self._stopping = True
        if self._writer is not None:
            self._writer.close()
        if self.process is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(self.process.wait), 5.0)
            except asyncio.TimeoutError:
                await self._kill()
        if self._reading is not None:
            await asyncio.wait({self._reading})

    async def _kill(self) -> None:
        self._stopping = True
        assert self.process is not None
        self.process.kill()
        await asyncio.to_thread(self.process.wait)
