"""The server's connection to one worker process: calls over the hop and
their answers, cancels, and the kill of a worker whose cancelled call runs
on past a grace. When the hop closes, the process is over: everything
pending on it fails, and every episode that lived there is CRASHED, with
how the process ended (`crash_error`)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, Any, Callable, Optional

from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc._runtime.workers.hop import Framing, answer_value, local_error
from ors_grpc._runtime.workers.startup import WorkerStartupError
from ors_grpc.observability import tracing
from ors_grpc.protocol.errors import (
    CRASH_CAUSE_EXITED, CRASH_CAUSE_TOOL_TIMEOUT, ORSError, environment_crashed, environment_crashed_from_exitcode,
)

if TYPE_CHECKING:
    from ors_grpc._runtime.environment_host import EpisodeHost
    from ors_grpc._runtime.workers.spawner import ProcessHandle

__all__ = ["KILL_GRACE_S", "WORKER_STOP_WAIT_S", "WorkerConnection", "crash_error", "none_up"]

logger = logging.getLogger("ors_grpc.workers")

#: Seconds a cancelled tool call (its timeout passed) may run on in its worker before the worker is killed.
KILL_GRACE_S = 5.0
#: Seconds stopping a worker waits for it to exit before killing it.
WORKER_STOP_WAIT_S = 5.0
#: Calls whose code the server kills the worker for when it outlives its cancellation.
_KILLABLE_OPS = frozenset({"run_tool", "score_group"})


def none_up(what: str) -> ORSError:
    """ENVIRONMENT_STARTING (retry later): no process can take a new episode now."""
    return ORSError(errors_pb2.ERROR_REASON_ENVIRONMENT_STARTING, f"{what}: they are being restarted")


def crash_error(status: Optional[int], cause: Optional[str] = None) -> ORSError:
    """ENVIRONMENT_CRASHED for an episode whose worker ended with `status` (Popen's
    returncode), killed by the server for `cause` when it was."""
    if status is None:
        return environment_crashed(cause or CRASH_CAUSE_EXITED)
    return environment_crashed_from_exitcode(status, cause)


class WorkerConnection:
    """The hop to one worker process, and the process itself."""

    def __init__(self, worker_id: int, process: ProcessHandle, on_lost: Callable[[WorkerConnection], None]) -> None:
        self.worker_id = worker_id
        self.process = process
        self._loop = asyncio.get_running_loop()
        #: The hop, once the handshake is done (the stream writer it took over kept alongside).
        self._hop: Optional[Framing] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        #: Done once the handshake is (with WorkerStartupError when the start failed).
        self.connected: asyncio.Future[None] = self._loop.create_future()
        #: The episodes living here, by episode id.
        self.hosts: dict[int, EpisodeHost] = {}
        self.alive = True
        #: Stopped by the server (a planned end: not a crash).
        self.stopping = False
        #: Why the server killed the process (a CRASH_CAUSE_*), if it did.
        self.killed_because: Optional[str] = None
        #: How the process ended (Popen's returncode), and why its episodes are lost: set with `ended`.
        self.status: Optional[int] = None
        self.crash: Optional[ORSError] = None
        self.ended = asyncio.Event()
        self._on_lost = on_lost
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count(1)
        #: Calls the server stopped waiting for, still running there: their kill timers.
        self._abandoned: dict[int, asyncio.TimerHandle] = {}
        #: Failing what lived here, once the hop closed.
        self._losing: Optional[asyncio.Task[None]] = None

    @property
    def episodes(self) -> int:
        return len(self.hosts)

    def kill(self, cause: str) -> None:
        """SIGKILL the process; its episodes are told `cause` (a CRASH_CAUSE_*)."""
        self.killed_because = cause
        self.process.kill()

    def attach(self, writer: asyncio.StreamWriter) -> None:
        """The handshake on `writer`'s connection is done: calls may go."""
        self._writer = writer
        self._hop = Framing(self._answered, self._closed, wait_a_turn=True)  # hop.py says why
        self._hop.take_over(writer)
        self.connected.set_result(None)

    def start_failed(self, error: WorkerStartupError) -> None:
        """The process never started: calls waiting for it fail."""
        if not self.connected.done():
            self.connected.set_exception(error)
            self.connected.exception()  # retrieved: no one may be waiting

    async def call(self, op: str, *args: Any) -> Any:
        if not self.connected.done():  # a process started for this episode alone
            try:
                await asyncio.shield(self.connected)
            except WorkerStartupError:  # logged by the pool; nothing of the episode ran
                raise none_up("the episode's process could not start") from None
        if not self.alive:
            await self.ended.wait()  # a call in the moment between the hop closing and the exit status read
            raise self.crash
        call_id = next(self._call_ids)
        answer = self._calls[call_id] = self._loop.create_future()
        try:
            # While tracing is on, the call carries its span's context: the environment's spans nest under it.
            message = (call_id, op, args) if tracing.tracer is None else (call_id, op, args, tracing.current_carrier())
            self._hop.send(message)
            return await answer
        except asyncio.CancelledError:
            if self.alive and (answer.cancelled() or not answer.done()):  # no answer came: it runs on there
                self._abandon(call_id, op)
            raise
        finally:
            self._calls.pop(call_id, None)

    def tell(self, op: str, *args: Any) -> None:
        """A message that wants no answer."""
        if self.alive and self._hop is not None:
            self._hop.send((0, op, args))

    def _abandon(self, call_id: int, op: str) -> None:
        """The server stopped waiting for call `call_id`: cancel it there; kill the process if it runs on."""
        self.tell("cancel", call_id)
        if op in _KILLABLE_OPS:
            self._abandoned[call_id] = self._loop.call_later(KILL_GRACE_S, self._kill_for, call_id, op)

    def _kill_for(self, call_id: int, op: str) -> None:
        self._abandoned.pop(call_id, None)
        if self.alive:
            logger.error("worker_killed worker=%d pid=%d reason=call_outlived_its_cancellation op=%s grace_s=%s "
                         "episodes=%d", self.worker_id, self.process.pid, op, KILL_GRACE_S, self.episodes)
            self.kill(CRASH_CAUSE_TOOL_TIMEOUT)

    def _answered(self, message: tuple[int, bool, Any]) -> None:
        call_id, ok, value = message
        if self._abandoned:
            timer = self._abandoned.pop(call_id, None)
            if timer is not None:
                timer.cancel()
        answer = self._calls.get(call_id)
        if answer is None or answer.done():
            return
        if not ok:
            answer.set_exception(local_error(value))
            return
        try:
            answer.set_result(answer_value(ok, value))
        except Exception as exc:  # (never: the worker sends only outputs that validate)
            answer.set_exception(exc)

    def _closed(self) -> None:
        self.alive = False  # no call goes from now on
        self._losing = self._loop.create_task(self._lost(), name=f"ors-worker-{self.worker_id}-lost")

    async def _lost(self) -> None:
        """The hop closed: the process ended (or is ending). Fail everything that lived here."""
        self.alive = False
        for timer in self._abandoned.values():
            timer.cancel()
        status = self.process.poll()
        if status is None:
            if not self.stopping:
                self.process.kill()  # a process that closed its end is of no more use
            status = await asyncio.to_thread(self.process.wait)
        self.status = status
        self.crash = crash_error(status, self.killed_because)
        self.ended.set()
        for host in list(self.hosts.values()):
            host.crash(self.crash)
        for answer in self._calls.values():
            if not answer.done():
                answer.set_exception(self.crash)
        self._on_lost(self)

    async def stop(self) -> None:
        """End the process (a planned stop): close the hop, wait for it to exit, kill it if it does not."""
        self.stopping = True
        self.alive = False
        if self._hop is not None:
            self._hop.close()
        try:
            await asyncio.wait_for(asyncio.to_thread(self.process.wait), WORKER_STOP_WAIT_S)
        except asyncio.TimeoutError:
            self.process.kill()
            await asyncio.to_thread(self.process.wait)
        if self._losing is not None:
            await asyncio.wait({self._losing})
