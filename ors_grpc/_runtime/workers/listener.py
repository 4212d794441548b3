"""The hop's listening end: one Unix socket in a fresh directory only the
server's user can open (0700; workers listen on nothing). Each worker that
connects says who it is (`hop.Hello`), gets what to import (`hop.Setup`) and
answers `hop.Ready`; a second connection of its own carries its heartbeats
(`hop.Heartbeats`), noted on its row of the process table."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import socket
import tempfile
import time
from typing import Callable, Optional

from ors_grpc._runtime.workers.hop import Heartbeat, Heartbeats, Hello, Ready, Setup, read_frame, write_frame
from ors_grpc._runtime.workers.process_table import ProcessState, ProcessTable, WorkerProcess
from ors_grpc._runtime.workers.spawner import pid_of
from ors_grpc._runtime.workers.startup import WORKER_START_TIMEOUT_S, WorkerStartupError

__all__ = ["HopListener"]

#: Connections to the hop waiting to be accepted (a burst of episode-process starts and their heartbeats);
#: the kernel caps it at net.core.somaxconn.
HOP_BACKLOG = 1024
HOP_DIRECTORY_PREFIX = "ors-workers-"
#: A hop directory this old whose socket refuses connections was left by a killed server.
STALE_HOP_DIRECTORY_S = 60.0


class HopListener:
    """Accepts the workers of `table`, hands each one that completed its handshake to `on_ready`
    and each one that failed it to `on_failed`."""

    def __init__(
        self, table: ProcessTable, setup: Setup, clock: Callable[[], float], *,
        on_ready: Callable[[WorkerProcess, asyncio.StreamWriter], None],
        on_failed: Callable[[WorkerProcess, WorkerStartupError], None],
    ) -> None:
        self._table = table
        self._setup = setup
        self._clock = clock
        self._on_ready = on_ready
        self._on_failed = on_failed
        self._directory = ""
        self.path = ""
        self._server: Optional[asyncio.AbstractServer] = None

    async def open(self) -> None:
        _remove_stale_hop_directories()
        self._directory = tempfile.mkdtemp(prefix=HOP_DIRECTORY_PREFIX)  # 0700: only this user can reach the hop
        self.path = os.path.join(self._directory, "hop.sock")
        self._server = await asyncio.start_unix_server(self._accept, path=self.path, backlog=HOP_BACKLOG)
        os.chmod(self.path, 0o600)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._directory:
            shutil.rmtree(self._directory, ignore_errors=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handshake(reader, writer)
        except asyncio.CancelledError:
            # The server stops with a handshake under way: asyncio's stream callback would log the
            # cancelled task as an error (with whatever was being handled, e.g. another worker's failed start).
            writer.close()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello: Hello | Heartbeats = await asyncio.wait_for(read_frame(reader), WORKER_START_TIMEOUT_S)
            if isinstance(hello, Heartbeats):
                return await self._hear_heartbeats(hello, reader, writer)
            process = self._table.get(hello.worker_id)
            if process is None or process.state is not ProcessState.STARTING or process.greeted:
                raise ValueError("no such worker is starting")
            process.greeted = True
            if await pid_of(process.connection.process) != hello.pid:
                raise ValueError("a worker id from another process")
        except Exception:
            writer.close()
            return
        write_frame(writer, self._setup)
        try:
            ready: Ready = await asyncio.wait_for(read_frame(reader), WORKER_START_TIMEOUT_S)
        except Exception as exc:
            self._on_failed(process, WorkerStartupError(f"worker {process.worker_id} ended while starting: {exc!r}"))
            return
        if ready.error:
            self._on_failed(process, WorkerStartupError(
                f"a worker process could not import the environments:\n{ready.error.rstrip()}"))
            return
        self._on_ready(process, writer)  # the connection's frames are the connection's (`hop.Framing`) now

    async def _hear_heartbeats(self, hello: Heartbeats, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
        """A worker's heartbeat connection: note each heartbeat until it closes."""
        process = self._table.get(hello.worker_id)
        if process is None or process.pid != hello.pid or process.heartbeats is not None:
            writer.close()
            return
        process.heartbeats = writer
        try:
            while True:
                heartbeat: Heartbeat = await read_frame(reader)
                process.heard_at, process.lag_s, process.held_s = self._clock(), heartbeat.lag_s, heartbeat.held_s
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker ended (its hop says how)
        finally:
            writer.close()


def _remove_stale_hop_directories() -> None:
    """Remove the hop directories of servers that were killed (SIGKILL leaves
    them): this user's, over a minute old, whose socket no one listens on."""
    now = time.time()
    for directory in glob.glob(os.path.join(tempfile.gettempdir(), HOP_DIRECTORY_PREFIX + "*")):
        try:
            info = os.stat(directory)
        except OSError:
            continue
        if info.st_uid != os.getuid() or now - info.st_mtime < STALE_HOP_DIRECTORY_S:
            continue
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(os.path.join(directory, "hop.sock"))
        except OSError:
            shutil.rmtree(directory, ignore_errors=True)
        finally:
            probe.close()
