"""Worker processes for environments' code, and the hosts that reach them.

`WorkerHosts` (a `HostFactory`) starts N worker processes and places each
new episode in the least-loaded live one, where it lives for its whole life;
class-level calls (splits, tasks, listings) go to the least-loaded worker
too. The server process keeps everything else: every door, the session
table, tool-call tasks and idempotency, records, warm-pool bookkeeping,
drain, metrics. The API key is checked in the server; secrets reach a
worker only over the hop, never in its argv, environment or logs.

How workers start: a fresh interpreter (`python -m
ors_grpc._runtime.workers.worker`, fork and exec at once), never a fork of
the server. grpc's core runs threads and holds locks that a forked child
would inherit in whatever state they were (its fork support is off by
default and does not cover grpc.aio): a fork after the server started can
deadlock or corrupt the child. multiprocessing's spawn would be as safe, but
re-imports the parent's `__main__` in every worker (a script without a main
guard would serve again, recursively) for nothing we need.

With `--isolation episode`, an episode process is a fork of a template
process, itself such a fresh interpreter, that imported the environments
and never runs grpc (`template`; `IsolatedHosts` says why not
multiprocessing's forkserver).

The hop: one Unix socket in a fresh directory only the server's user can
open (0700, `tempfile.mkdtemp`); workers listen on nothing. Environments are
imported in the worker by `module:qualname`, so a class defined in a
script's `__main__` cannot be served by workers: serving fails at start
(`WorkerStartupError`, the CLI's exit status 2) saying so.

Faults: a worker that ends (exits, is killed) fails the calls in flight on
it at once, naming its exit status or signal, and every episode that lived
in it answers its later calls ERROR_REASON_ENVIRONMENT_CRASHED (its state is
gone: a call is never sent again to another worker); a new worker takes its
place (after a backoff when workers keep dying young: a crash loop). A call
the server stopped waiting for (the tool timeout, measured here, in the
server) is cancelled in the worker; code still running `KILL_GRACE_S` later
(a sync call in a thread, a blocked event loop) gets its worker killed and
replaced, so no thread outlives its call's timeout by more than the grace.

Stalls, with or without a tool timeout: each worker watches its event loop
from a thread (`loop_monitor`) and another thread reports what it sees
every heartbeat period (`HEARTBEAT_INTERVAL_S`, at most a quarter of the
limit) on a connection of its own with blocking writes (`hop.Heartbeats`).
A worker whose loop one callback has held past the stall limit
(`--worker-stall-limit`, `DEFAULT_STALL_LIMIT_S`: a blocking call in an
`async def`, a spin), or from which no heartbeat came for as long (a
stopped process, C code that never lets the GIL go), is killed and
replaced; its episodes answer ENVIRONMENT_CRASHED with cause `stalled`.

Why load never trips it. The verdict is not the loop's lag (how late a
callback posted from outside runs): load stretches that. Under CPU-heavy
sync tools in threads, every GIL hand-over of the loop waits behind the
threads, so a loop running many quick callbacks falls behind in proportion
to the calls in flight (measured here: 0.14 s with 12 episodes per worker,
1.3 s with 100; thousands would reach tens of seconds). The verdict is how
long one callback has run, which load keeps short (0 with 12
episodes per worker; 0.7 s at most with 100, on two cores shared with other
jobs: one step that takes in a batch of requests, slowed by the same GIL
hand-overs), and which grows without bound only while one piece of code
holds the loop. Silence needs the process to get no CPU, or no GIL, at all.
The default, 60 s: the verifiers env server's heartbeat, sent from the loop
itself, killed healthy busy workers at 30 s and went to 60 s; ours cannot be
held back by load, and still 60 s rather than gunicorn's 30 s, because a
kill costs every episode of the worker and an `async def setup` that blocks
its loop for tens of seconds (building an image with `subprocess.run`) is
slow but works, and should keep working. A silence is counted only while
this server's own loop runs: heartbeats that wait unread because it was held
do not count against a worker.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import os
import glob
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Callable, Optional, Sequence, Union

from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc._runtime.environment_host import CatalogHost, EpisodeHost, EpisodeState, HostFactory
from ors_grpc._runtime.workers.hop import (
    Exited, Fork, Forked, Heartbeat, Heartbeats, Hello, Ready, Setup, local_error, read_frame, write_frame,
)
from ors_grpc.authoring.environment import Environment, overrides
from ors_grpc.authoring.types import GroupCandidate, JSONObject, ListToolsOutput, RunToolOutput
from ors_grpc.observability import metrics, tracing
from ors_grpc.protocol.errors import (
    CRASH_CAUSE_EXITED, CRASH_CAUSE_KEY, CRASH_CAUSE_MEMORY_LIMIT, CRASH_CAUSE_STALLED, CRASH_CAUSE_TOOL_TIMEOUT,
    ORSError, environment_crashed, environment_crashed_from_exitcode,
)

__all__ = ["DEFAULT_STALL_LIMIT_S", "IsolatedHosts", "WorkerHosts", "WorkerStartupError", "worker_count"]

logger = logging.getLogger("ors_grpc.workers")

#: Seconds a worker may take to start and import the environments.
WORKER_START_TIMEOUT_S = 60.0
#: Seconds stopping workers waits for them to exit before killing them.
WORKER_STOP_WAIT_S = 5.0
#: Seconds a cancelled tool call (its timeout passed) may run on in its worker before the worker is killed.
KILL_GRACE_S = 5.0
#: A worker that ends within this many seconds of starting died young: replacing it backs off
#: (0.5 s, doubling, at most `MAX_RESTART_BACKOFF_S`) until one lives longer.
YOUNG_DEATH_S = 10.0
MAX_RESTART_BACKOFF_S = 30.0
#: Connections to the hop waiting to be accepted (a burst of episode-process starts and their heartbeats);
#: the kernel caps it at net.core.somaxconn.
HOP_BACKLOG = 1024
HOP_DIRECTORY_PREFIX = "ors-workers-"
#: A hop directory this old whose socket refuses connections was left by a killed server.
STALE_HOP_DIRECTORY_S = 60.0
#: Seconds between two readings of the workers' memory (with a memory limit).
MEMORY_POLL_S = 1.0
#: Seconds one callback may hold a worker's event loop, or the worker stay silent, before it is
#: killed (`--worker-stall-limit`; 0: never). Far above what load makes: see the module's docstring.
DEFAULT_STALL_LIMIT_S = 60.0
#: Seconds between a worker's heartbeats (at most a quarter of the stall limit).
HEARTBEAT_INTERVAL_S = 1.0
#: Calls whose code the server kills the worker for when it outlives its cancellation.
_KILLABLE_OPS = frozenset({"run_tool", "score_group"})


class WorkerStartupError(Exception):
    """Workers cannot serve these environments (a class in `__main__`, an import that fails in a worker)."""


def worker_count(value: str) -> int:
    """`--workers` as a number: N, or `auto` (the CPUs this process may run on)."""
    if value == "auto":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    count = int(value)
    if count < 1:
        raise ValueError("--workers must be at least 1, or auto")
    return count


def import_path(cls: type, what: str) -> str:
    """`module:qualname` of a class a worker must import; WorkerStartupError when it cannot."""
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        raise WorkerStartupError(
            f"{what} {cls.__qualname__!r} is defined in {'a function' if '<locals>' in cls.__qualname__ else '__main__'}: "
            f"worker processes import environments by module. Move it to a module and serve MODULE:CLASS "
            f"(or serve without --workers)")
    return f"{cls.__module__}:{cls.__qualname__}"


class _Worker:
    """One worker process and its end of the hop."""

    #: Why the server killed the worker (a CRASH_CAUSE_*), if it did.
    killed_because: str | None = None

    def __init__(
        self, worker_id: int, process: subprocess.Popen[bytes] | ForkedProcess, on_lost: Callable[[_Worker], None],
    ) -> None:
        self.worker_id = worker_id
        self.process = process
        self.started = asyncio.get_running_loop().time()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.connected: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: The episodes living here, by episode id.
        self.hosts: dict[int, WorkerEpisodeHost] = {}
        self.alive = True
        self.stopping = False
        self._on_lost = on_lost
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count(1)
        #: Calls the server stopped waiting for, still running here: their kill timers.
        self._abandoned: dict[int, asyncio.TimerHandle] = {}
        self._reading: asyncio.Task[None] | None = None
        #: Why the episodes here are lost, once `_lost` has read how the process ended (`ended` is set).
        self.crash: ORSError | None = None
        self.ended = asyncio.Event()
        #: When the last heartbeat came (loop time; from `attach` until the first), and what it reported.
        self.heard_at: float | None = None
        self.lag_s = self.held_s = 0.0
        self.heartbeats: asyncio.StreamWriter | None = None

    def kill(self, cause: str) -> None:
        """SIGKILL the worker; its episodes are told `cause` (a CRASH_CAUSE_*)."""
        self.killed_because = cause
        self.process.kill()

    @property
    def episodes(self) -> int:
        return len(self.hosts)

    def attach(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.heard_at = asyncio.get_running_loop().time()
        self._reading = asyncio.get_running_loop().create_task(self._read_forever(), name=f"ors-worker-{self.worker_id}")

    async def call(self, op: str, *args: Any) -> Any:
        if not self.connected.done():  # a process started for this episode (`--isolation episode`)
            try:
                await asyncio.shield(self.connected)
            except WorkerStartupError:  # logged by the start's watcher; nothing of the episode ran
                raise _none_up("the episode's process could not start") from None
        if not self.alive:
            await self.ended.wait()  # a call in the moment between the hop closing and the exit status read
            raise self.crash
        call_id = next(self._call_ids)
        answer = self._calls[call_id] = asyncio.get_running_loop().create_future()
        try:
            # While tracing is on, the call carries its span's context: the environment's spans nest under it.
            message = (call_id, op, args) if tracing.tracer is None else (call_id, op, args, tracing.current_carrier())
            write_frame(self.writer, message)
            return await answer
        except asyncio.CancelledError:
            if self.alive and (answer.cancelled() or not answer.done()):  # no answer came: it runs on there
                self._abandon(call_id, op)
            raise
        finally:
            self._calls.pop(call_id, None)

    def _abandon(self, call_id: int, op: str) -> None:
        """The server stopped waiting for call `call_id`: cancel it here; kill the worker if it runs on."""
        self.tell("cancel", call_id)
        if op in _KILLABLE_OPS:
            self._abandoned[call_id] = asyncio.get_running_loop().call_later(KILL_GRACE_S, self._kill_for, call_id)

    def _kill_for(self, call_id: int) -> None:
        self._abandoned.pop(call_id, None)
        if self.alive:
            logger.warning("worker_killed worker=%d reason=call_outlived_its_cancellation grace_s=%s episodes=%d",
                           self.worker_id, KILL_GRACE_S, self.episodes)
            self.kill(CRASH_CAUSE_TOOL_TIMEOUT)

    def tell(self, op: str, *args: Any) -> None:
        """A message that wants no answer."""
        if self.alive and self.writer is not None:
            write_frame(self.writer, (0, op, args))

    async def _read_forever(self) -> None:
        try:
            while True:
                call_id, ok, value = await read_frame(self.reader)
                timer = self._abandoned.pop(call_id, None)
                if timer is not None:
                    timer.cancel()
                answer = self._calls.get(call_id)
                if answer is None or answer.done():
                    continue
                if ok:
                    answer.set_result(value)
                else:
                    answer.set_exception(local_error(value))
        except (asyncio.IncompleteReadError, ConnectionError, EOFError):
            pass
        finally:
            await self._lost()

    async def _lost(self) -> None:
        """The hop closed: the process ended (or is ending). Fail everything that lived here."""
        self.alive = False
        for timer in self._abandoned.values():
            timer.cancel()
        if self.heartbeats is not None:
            self.heartbeats.close()
        status = self.process.poll()
        if status is None:
            if not self.stopping:
                self.process.kill()  # a worker that closed its end is of no more use
            status = await asyncio.to_thread(self.process.wait)
        self.crash = _crashed(status, self.killed_because)
        self.ended.set()
        for host in list(self.hosts.values()):
            host.crash(self.crash)
        for answer in self._calls.values():
            if not answer.done():
                answer.set_exception(self.crash)
        if not self.stopping:
            if status != 0 or self.hosts:
                logger.error("worker_exited worker=%d pid=%d %s episodes_lost=%d", self.worker_id, self.process.pid,
                             _exit_text(status), len(self.hosts))
                metrics.worker_died(self.crash.metadata[CRASH_CAUSE_KEY])
            self._on_lost(self)

    async def stop(self) -> None:
        self.stopping = True
        self.alive = False
        if self.writer is not None:
            self.writer.close()
        try:
            await asyncio.wait_for(asyncio.to_thread(self.process.wait), WORKER_STOP_WAIT_S)
        except asyncio.TimeoutError:
            self.process.kill()
            await asyncio.to_thread(self.process.wait)
        if self._reading is not None:
            await asyncio.wait({self._reading})


def _none_up(what: str) -> ORSError:
    """ENVIRONMENT_STARTING (retry later): no process can take a new episode now."""
    return ORSError(errors_pb2.ERROR_REASON_ENVIRONMENT_STARTING, f"{what}: they are being restarted")


def _crashed(status: int | None, cause: str | None = None) -> ORSError:
    """ENVIRONMENT_CRASHED for an episode whose worker ended with `status` (Popen's
    returncode), killed by the server for `cause` when it was."""
    if status is None:
        return environment_crashed(cause or CRASH_CAUSE_EXITED)
    return environment_crashed_from_exitcode(status, cause)


def _exit_text(status: int | None) -> str:
    if status is None:
        return "exit status unknown"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


class _RemoteTool:
    """A tool of an episode in a worker, as the server's tool calls need it:
    its name and concurrency marks (read from the class; the function runs in the worker)."""

    __slots__ = ("name", "_env_tool_exclusive", "_env_tool_terminal", "_env_tool_concurrent")

    def __init__(self, name: str, fn: Any) -> None:
        self.name = name
        self._env_tool_exclusive = getattr(fn, "_env_tool_exclusive", False)
        self._env_tool_terminal = getattr(fn, "_env_tool_terminal", False)
        self._env_tool_concurrent = getattr(fn, "_env_tool_concurrent", False)


class WorkerEpisodeHost(EpisodeHost):
    """One episode whose environment lives in a worker process."""

    __slots__ = ("_worker", "_eid", "_toolset_cls", "_set_up", "_env_name")

    def __init__(self, env_cls: type[Environment], env_name: str, worker: _Worker, eid: int) -> None:
        super().__init__(env_cls)
        self._worker = worker
        self._eid = eid
        self._env_name = env_name
        self._toolset_cls: type | None = None
        self._set_up = False
        worker.hosts[eid] = self

    @property
    def uninterruptible(self) -> bool:
        return False  # the server stops waiting; the worker tears the episode down once its step ends

    @property
    def set_up(self) -> bool:
        return self._set_up

    async def construct(self, task_spec: JSONObject, secrets: dict[str, str]) -> None:
        await self._worker.call("construct", self._eid, self._env_name, task_spec, secrets)

    async def attach_toolset(self, toolset_cls: type) -> None:
        self._toolset_cls = toolset_cls
        await self._worker.call("attach_toolset", self._eid, import_path(toolset_cls, "toolset"))

    async def setup(self) -> None:
        if self.state is EpisodeState.CONSTRUCTING:
            self.state = EpisodeState.SETTING_UP
        await self._worker.call("setup", self._eid)
        self._set_up = True
        if self.state is EpisodeState.SETTING_UP:
            self.state = EpisodeState.READY

    async def teardown(self) -> None:
        if self._worker.alive:  # else the environment went with its worker
            await self._worker.call("teardown", self._eid)

    def end(self) -> None:
        if self.state is not EpisodeState.ENDED:
            self._worker.hosts.pop(self._eid, None)
            self._worker.tell("end", self._eid)
        super().end()

    def kill(self) -> None:
        self.end()

    def implements(self, hook: str) -> bool:
        return overrides(self.env_cls, hook)

    def prompt(self) -> Any:
        return self._worker.call("prompt", self._eid)

    def messages(self) -> Any:
        return self._worker.call("messages", self._eid)

    def task_tools(self) -> Any:
        return self._worker.call("task_tools", self._eid)

    def resolve_tool(self, name: str) -> Union[Callable[..., Any], RunToolOutput]:
        fn = getattr(self._toolset_cls, name, None) if self._toolset_cls is not None else None
        if not Environment._is_tool(fn):
            fn = getattr(self.env_cls, name, None)
        return _RemoteTool(name, fn)  # a name it lacks is refused by the worker (not_found)

    def run_tool(self, name: str, tool: Any, tool_input: JSONObject) -> Any:
        return self._worker.call("run_tool", self._eid, name, tool_input)

    def score_group(self, candidates: Sequence[GroupCandidate]) -> Any:
        return self._worker.call("score_group", self._eid, list(candidates))


class WorkerCatalogHost(CatalogHost):
    """An environment class's own calls, answered by the least-loaded worker."""

    __slots__ = ("_hosts", "_env_name")

    def __init__(self, env_cls: type[Environment], env_name: str, hosts: WorkerHosts) -> None:
        super().__init__(env_cls)
        self._hosts = hosts
        self._env_name = env_name

    async def _call(self, method: str, *args: Any) -> Any:
        worker = await self._hosts.catalog_worker()
        return await worker.call("catalog", self._env_name, method, args)

    def list_splits(self) -> Any:
        return self._call("list_splits")

    async def list_tools(self) -> ListToolsOutput:
        return self.env_cls.list_tools()  # the class's own declaration: no environment code runs

    def list_tasks(self, split: str) -> Any:
        return self._call("list_tasks", split)

    def num_tasks(self, split: str) -> Any:
        return self._call("num_tasks", split)

    def get_task(self, split: str, index: int) -> Any:
        return self._call("get_task", split, index)

    def get_task_range(self, split: str, start: Optional[int], stop: Optional[int]) -> Any:
        return self._call("get_task_range", split, start, stop)


class WorkerHosts(HostFactory):
    """`count` worker processes for `environments` (and `toolsets`), supervised by the server."""

    def __init__(
        self, count: int, environments: dict[str, type[Environment]], toolsets: dict[str, type],
        *, memory_limit_mib: float | None = None, stall_limit_s: float = DEFAULT_STALL_LIMIT_S,
    ) -> None:
        self._count = count
        self._memory_limit_bytes = memory_limit_mib * 1024 * 1024 if memory_limit_mib else None
        self._memory_watch: asyncio.Task[None] | None = None
        self._stall_limit_s = stall_limit_s
        self._stall_watch: asyncio.Task[None] | None = None
        self._names = {env_cls: name for name, env_cls in environments.items()}
        self._setup = Setup(
            sys_path=list(sys.path),
            environments={name: import_path(cls, "environment") for name, cls in environments.items()},
            toolsets=[import_path(cls, "toolset") for cls in toolsets.values()],
            log_level=logging.getLogger().getEffectiveLevel(),
            heartbeat_interval_s=min(HEARTBEAT_INTERVAL_S, stall_limit_s / 4),
        )
        self._workers: list[_Worker] = []
        #: Every worker started and not yet forgotten, by id (its heartbeats may come before it joins `_workers`).
        self._by_id: weakref.WeakValueDictionary[int, _Worker] = weakref.WeakValueDictionary()
        self._catalogs: dict[type[Environment], WorkerCatalogHost] = {}
        self._episode_ids = itertools.count(1)
        self._worker_ids = itertools.count(1)
        self._directory = ""
        self._path = ""
        self._server: asyncio.AbstractServer | None = None
        self._pending: dict[int, _Worker] = {}
        self._closing = False
        #: Workers that died young in a row (a crash loop when it grows); the restart backoff doubles with it.
        self._young_deaths = 0
        #: Whether the current run of failed starts was logged (with its traceback): once per crash loop.
        self._start_failure_logged = False
        self._restarts: set[asyncio.Task[None]] = set()
        self._on_availability: Callable[[bool], None] | None = None
        self._available = True
        self._untrack_metrics: Callable[[], None] = lambda: None

    async def start(self) -> None:
        """Start every worker; WorkerStartupError (with the worker's traceback) when one cannot import."""
        _remove_stale_hop_directories()
        self._directory = tempfile.mkdtemp(prefix=HOP_DIRECTORY_PREFIX)  # 0700: only this user can reach the hop
        self._path = os.path.join(self._directory, "hop.sock")
        self._server = await asyncio.start_unix_server(self._accept, path=self._path, backlog=HOP_BACKLOG)
        os.chmod(self._path, 0o600)
        starting = [self._spawn() for _ in range(self._count)]
        try:
            await asyncio.gather(*(self._until_ready(worker) for worker in starting))
        except BaseException:
            self._workers = starting
            await self.close()
            raise
        self._workers = starting
        if self._memory_limit_bytes is not None:
            self._memory_watch = asyncio.get_running_loop().create_task(self._watch_memory(), name="ors-worker-memory")
        self._untrack_metrics = metrics.track_workers(self._readings)
        if self._stall_limit_s:
            self._stall_watch = asyncio.get_running_loop().create_task(self._watch_stalls(),
                                                                       name="ors-worker-stalls")
        logger.info("workers_started count=%d pids=%s", self._count,
                    ",".join(str(w.process.pid) for w in self._workers))

    def _spawn(self) -> _Worker:
        worker_id = next(self._worker_ids)
        worker = self._pending[worker_id] = self._by_id[worker_id] = _Worker(
            worker_id, self._start_process(worker_id), self._replace)
        return worker

    def _start_process(self, worker_id: int) -> subprocess.Popen[bytes] | ForkedProcess:
        """A fresh interpreter that serves as worker `worker_id` (see the module's docstring)."""
        return subprocess.Popen(
            [sys.executable, "-m", "ors_grpc._runtime.workers.worker", self._path, str(worker_id), str(os.getpid())],
            stdin=subprocess.DEVNULL, env=_worker_environment(),
        )

    def _replace(self, dead: _Worker) -> None:
        """Start a worker in the place of `dead` (backing off while workers die young)."""
        if self._closing:
            return
        if dead in self._workers:
            self._workers.remove(dead)
        young = asyncio.get_running_loop().time() - dead.started < YOUNG_DEATH_S
        self._young_deaths = self._young_deaths + 1 if young else 0
        self._notify_availability()
        task = asyncio.get_running_loop().create_task(self._restart(), name="ors-worker-restart")
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    def watch_availability(self, on_change: Callable[[bool], None]) -> None:
        self._on_availability = on_change

    def _serving(self) -> bool:
        """Whether new episodes can be served now (health SERVING)."""
        return any(worker.alive for worker in self._workers)

    def _notify_availability(self) -> None:
        available = self._serving()
        if available != self._available:
            self._available = available
            logger.log(logging.INFO if available else logging.ERROR, "workers_available=%s", available)
            if self._on_availability is not None:
                self._on_availability(available)

    def _backoff_s(self) -> float:
        return 0.0 if self._young_deaths == 0 else min(MAX_RESTART_BACKOFF_S, 0.5 * 2 ** (self._young_deaths - 1))

    async def _restart(self) -> None:
        while not self._closing:
            backoff = self._backoff_s()
            if self._young_deaths == 3:  # once per crash loop
                logger.error("worker_crash_loop young_deaths=%d backoff_s=%s workers_up=%d",
                             self._young_deaths, backoff, len(self._workers))
            await asyncio.sleep(backoff)
            if self._closing:
                return
            worker = self._spawn()
            try:
                await self._until_ready(worker)
            except WorkerStartupError as exc:
                self._pending.pop(worker.worker_id, None)
                if worker.process.poll() is None:
                    worker.process.kill()
                self._log_start_failure("worker_restart_failed", exc)
                self._young_deaths += 1
                continue
            self._start_failure_logged = False
            if self._closing:
                await worker.stop()
                return
            self._workers.append(worker)
            logger.info("worker_started worker=%d pid=%d", worker.worker_id, worker.process.pid)
            self._notify_availability()
            return

    def _log_start_failure(self, event: str, exc: WorkerStartupError) -> None:
        """Log why a worker could not start (the worker's traceback) once per run of failed starts:
        the first worker that dies young already counts toward the crash loop, so this is the report."""
        if not self._start_failure_logged:
            self._start_failure_logged = True
            logger.error("%s %s", event, exc)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello: Hello | Heartbeats = await asyncio.wait_for(read_frame(reader), WORKER_START_TIMEOUT_S)
            if isinstance(hello, Heartbeats):
                return await self._hear_heartbeats(hello, reader, writer)
            worker = self._pending.pop(hello.worker_id)
            if await _pid_of(worker.process) != hello.pid:
                raise ValueError("a worker id from another process")
        except Exception:
            writer.close()
            return
        write_frame(writer, self._setup)
        try:
            ready: Ready = await asyncio.wait_for(read_frame(reader), WORKER_START_TIMEOUT_S)
        except Exception as exc:
            worker.connected.set_exception(WorkerStartupError(f"worker {worker.worker_id} ended while starting: {exc!r}"))
            return
        if ready.error:
            worker.connected.set_exception(WorkerStartupError(
                f"a worker process could not import the environments:\n{ready.error.rstrip()}"))
            return
        worker.attach(reader, writer)
        worker.connected.set_result(None)

    async def _until_ready(self, worker: _Worker) -> None:
        deadline = asyncio.get_running_loop().time() + WORKER_START_TIMEOUT_S
        while not worker.connected.done():
            if worker.process.poll() is not None:
                raise WorkerStartupError(
                    f"worker {worker.worker_id} {_exit_text(worker.process.returncode)} while starting")
            if asyncio.get_running_loop().time() > deadline:
                raise WorkerStartupError(f"worker {worker.worker_id} did not start within {WORKER_START_TIMEOUT_S:g}s")
            await asyncio.wait({worker.connected}, timeout=0.05)
        worker.connected.result()

    async def _watch_memory(self) -> None:
        """Kill a worker whose RSS passed the limit, before the machine's OOM killer picks the server."""
        assert self._memory_limit_bytes is not None
        while True:
            await asyncio.sleep(MEMORY_POLL_S)
            for worker in list(self._workers):
                rss = _rss_bytes(worker.process.pid)
                if worker.alive and rss is not None and rss > self._memory_limit_bytes:
                    logger.error("worker_killed worker=%d reason=memory_limit rss_mib=%.0f limit_mib=%.0f episodes=%d",
                                 worker.worker_id, rss / 2**20, self._memory_limit_bytes / 2**20, worker.episodes)
                    worker.kill(CRASH_CAUSE_MEMORY_LIMIT)

    async def _hear_heartbeats(self, hello: Heartbeats, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
        """A worker's heartbeat connection: note each heartbeat until it closes."""
        worker = self._by_id.get(hello.worker_id)
        if worker is None or worker.process.pid != hello.pid or worker.heartbeats is not None:
            writer.close()
            return
        worker.heartbeats = writer
        loop = asyncio.get_running_loop()
        try:
            while True:
                heartbeat: Heartbeat = await read_frame(reader)
                worker.heard_at, worker.lag_s, worker.held_s = loop.time(), heartbeat.lag_s, heartbeat.held_s
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker ended (its hop says how)
        finally:
            writer.close()

    async def _watch_stalls(self) -> None:
        """Kill a worker whose loop one callback has held past the stall limit, or that has not
        reported for as long."""
        loop = asyncio.get_running_loop()
        period = self._setup.heartbeat_interval_s
        looked_at = loop.time()
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            if now - looked_at > 2 * period:  # this loop was held: heartbeats may wait unread, start afresh
                for worker in self._workers:
                    if worker.heard_at is not None:
                        worker.heard_at = max(worker.heard_at, now - period)
            looked_at = now
            for worker in list(self._workers):
                if worker.alive and worker.killed_because is None and worker.heard_at is not None:
                    self._kill_if_stalled(worker, now)

    def _kill_if_stalled(self, worker: _Worker, now: float) -> None:
        silent_s = now - worker.heard_at
        if worker.held_s > self._stall_limit_s:
            reason = "event_loop_held"
        elif silent_s > self._stall_limit_s:
            reason = "no_heartbeat"
        else:
            return
        logger.error("worker_killed worker=%d pid=%d reason=%s held_s=%.1f lag_s=%.1f silent_s=%.1f "
                     "stall_limit_s=%g episodes=%d", worker.worker_id, worker.process.pid, reason, worker.held_s,
                     worker.lag_s, silent_s, self._stall_limit_s, worker.episodes)
        worker.kill(CRASH_CAUSE_STALLED)

    def least_loaded(self) -> _Worker:
        live = [worker for worker in self._workers if worker.alive]
        if not live:
            raise _none_up("no worker process is up")
        return min(live, key=lambda worker: worker.episodes)

    def episode(self, env_cls: type[Environment]) -> WorkerEpisodeHost:
        return WorkerEpisodeHost(env_cls, self._names[env_cls], self.least_loaded(), next(self._episode_ids))

    async def catalog_worker(self) -> _Worker:
        """The process for a class-level call (splits, tasks)."""
        return self.least_loaded()

    def catalog(self, env_cls: type[Environment]) -> WorkerCatalogHost:
        host = self._catalogs.get(env_cls)
        if host is None:
            host = self._catalogs[env_cls] = WorkerCatalogHost(env_cls, self._names[env_cls], self)
        return host

    def worker_pids(self) -> list[int]:
        return [worker.process.pid for worker in self._workers if worker.alive and worker.process.pid is not None]

    def _readings(self) -> list[metrics.WorkerReading]:
        """The workers up and serving, read at a metrics scrape (their memory too: no call pays for it)."""
        return [metrics.WorkerReading(worker.worker_id, worker.episodes, _rss_bytes(worker.process.pid))
                for worker in self._workers if worker.alive and worker.writer is not None]

    async def close(self) -> None:
        """Stop every worker (after the session table ended its episodes)."""
        self._closing = True
        self._untrack_metrics()
        for task in [*self._restarts, *filter(None, [self._memory_watch, self._stall_watch])]:
            task.cancel()
        if self._server is not None:
            self._server.close()
        await asyncio.gather(*(worker.stop() for worker in self._workers))
        for worker in self._pending.values():
            worker.process.kill()
        if self._directory:
            shutil.rmtree(self._directory, ignore_errors=True)


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


def _rss_bytes(pid: int) -> int | None:
    """A process's resident memory (VmRSS), None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _worker_environment() -> dict[str, str]:
    """The server's environment for a worker, unbuffered (its log lines arrive whole)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


async def _pid_of(process: subprocess.Popen[bytes] | ForkedProcess) -> int | None:
    """A worker process's pid (a forked one's once the template has said it; None if it never forked it)."""
    if isinstance(process, ForkedProcess):
        await process.forked.wait()
    return process.pid


# --- episode processes forked from a template (`--isolation episode`) --------

class ForkedProcess:
    """An episode process forked by the template, as a worker sees its process
    (`subprocess.Popen`'s pid, poll, wait, kill, returncode): its pid and exit
    status come from the template, its parent."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.returncode: int | None = None
        #: Set once the template forked it (`pid`), or ended without doing so.
        self.forked = asyncio.Event()
        self._ended = threading.Event()
        self._kill_once_forked = False

    def poll(self) -> int | None:
        return self.returncode

    def wait(self) -> int | None:
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
    """The server's end of the template process (`template`): started once
    (with the environments imported in it), asked for a fork per episode
    process, reporting how each ended."""

    def __init__(self, setup: Setup, on_lost: Callable[[TemplateProcess], None]) -> None:
        self._setup = setup
        self._on_lost = on_lost
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.alive = False
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
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
                stdin=subprocess.DEVNULL, env=_worker_environment(), pass_fds=[template_end.fileno()],
            )
        self.started = asyncio.get_running_loop().time()
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
                f"the template process {_exit_text(self.process.returncode)} while starting") from None
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
                await asyncio.wait_for(asyncio.to_thread(self.process.wait), WORKER_STOP_WAIT_S)
            except asyncio.TimeoutError:
                await self._kill()
        if self._reading is not None:
            await asyncio.wait({self._reading})

    async def _kill(self) -> None:
        self._stopping = True
        assert self.process is not None
        self.process.kill()
        await asyncio.to_thread(self.process.wait)


class IsolatedHosts(WorkerHosts):
    """`--isolation episode`: every episode in a process of its own, which ends
    with the episode. `pool` processes (environments imported) are kept
    started and idle, so creating an episode does not wait for a process
    start; a fault costs exactly its own episode.

    Episode processes are forked from a template process (`template`) that
    imported the environments once and never started grpc, so starting one
    costs a fork, not an interpreter's start and imports (about 0.5 s of CPU
    each, which under load emptied the pool and made creations wait).
    multiprocessing's forkserver would do the forking but does not fit: each
    child re-runs the server's `__main__` (`ors_grpc.cli`, or the operator's
    script: without a main guard it would serve again, in the episode
    process), a preload that fails is silently skipped (ImportError) or kills
    the fork server, leaving the server an EOFError instead of the
    environment's traceback, and the fork server is one per interpreter with
    one preload list. If the template dies, its episode processes die with it
    (their ends answer ENVIRONMENT_CRASHED, killed by SIGKILL) and a new
    template is started (backing off while templates die young; health
    NOT_SERVING meanwhile).
    """

    def __init__(
        self, pool: int, environments: dict[str, type[Environment]], toolsets: dict[str, type],
        *, memory_limit_mib: float | None = None, stall_limit_s: float = DEFAULT_STALL_LIMIT_S,
    ) -> None:
        super().__init__(pool, environments, toolsets, memory_limit_mib=memory_limit_mib,
                         stall_limit_s=stall_limit_s)
        self._setup = dataclasses.replace(self._setup, exit_after_episode=True)
        #: Started processes no episode has claimed yet, oldest first.
        self._idle: collections.deque[_Worker] = collections.deque()
        self._starting = 0
        #: Set when a start ends, well or not (what `catalog_worker` waits for).
        self._pool_changed = asyncio.Event()
        self._template: TemplateProcess | None = None

    async def start(self) -> None:
        """Start the template (WorkerStartupError with its traceback when it cannot import
        the environments), then fork the pool from it."""
        self._template = TemplateProcess(self._setup, self._template_lost)
        await self._template.start()
        try:
            await super().start()
        except BaseException:
            await self._template.stop()
            raise
        self._idle.extend(self._workers)

    def _start_process(self, worker_id: int) -> ForkedProcess:
        assert self._template is not None
        return self._template.fork(worker_id, self._path)

    def _template_up(self) -> bool:
        return self._template is not None and self._template.alive

    def _serving(self) -> bool:
        """A template to fork from, and an idle process to take or forks that succeed (not a crash loop)."""
        return self._template_up() and (any(worker.alive for worker in self._idle) or not self._young_deaths)

    def episode(self, env_cls: type[Environment]) -> WorkerEpisodeHost:
        while self._idle and not self._idle[0].alive:
            self._idle.popleft()
        if self._idle:
            worker = self._idle.popleft()
            self._notify_availability()
        elif not self._template_up():
            raise _none_up("no episode process can start: the template process is being restarted")
        elif self._young_deaths:  # processes keep failing to start (a crash loop): not one more per creation
            raise _none_up("no episode process could start")
        else:  # the pool ran dry: a process of its own all the same, its calls wait for it to start
            worker = self._spawn()
            self._watch_start(worker, into_pool=False)
            self._workers.append(worker)
        self._top_up()
        return WorkerEpisodeHost(env_cls, self._names[env_cls], worker, next(self._episode_ids))

    async def catalog_worker(self) -> _Worker:
        """An idle process (it stays idle after class-level calls), waiting for one while the pool
        refills: never an episode's, which may end with its episode while the call runs."""
        deadline = asyncio.get_running_loop().time() + WORKER_START_TIMEOUT_S
        while True:
            for worker in self._idle:
                if worker.alive:
                    return worker
            remaining = deadline - asyncio.get_running_loop().time()
            if not self._serving() or remaining <= 0:
                raise _none_up("no process is up for the environment's own calls")
            self._top_up()
            self._pool_changed.clear()
            try:
                await asyncio.wait_for(self._pool_changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    def _top_up(self) -> None:
        while not self._closing and self._template_up() and len(self._idle) + self._starting < self._count:
            self._watch_start(self._spawn(), into_pool=True)

    def _watch_start(self, worker: _Worker, *, into_pool: bool) -> None:
        if into_pool:
            self._starting += 1
        task = asyncio.get_running_loop().create_task(self._started(worker, into_pool), name="ors-episode-process")
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _started(self, worker: _Worker, into_pool: bool) -> None:
        try:
            await self._until_ready(worker)
        except WorkerStartupError as exc:
            self._pending.pop(worker.worker_id, None)
            if worker.process.poll() is None:
                worker.process.kill()
            if not worker.connected.done():
                worker.connected.set_exception(exc)
            if worker in self._workers:  # a process started for one episode
                self._workers.remove(worker)
            lost_with_its_template = not self._template_up()  # counted there; the next template tops up
            if not lost_with_its_template:
                self._log_start_failure("episode_process_start_failed", exc)
                self._young_deaths += 1
            self._notify_availability()
            self._pool_changed.set()
            if into_pool:
                if not lost_with_its_template:
                    await asyncio.sleep(self._backoff_s())  # still counted as starting: no start meanwhile
                self._starting -= 1
                self._top_up()
            return
        self._young_deaths = 0
        self._start_failure_logged = False
        if into_pool:
            self._starting -= 1
            if self._closing:
                await worker.stop()
                return
            self._workers.append(worker)
            self._idle.append(worker)
        self._notify_availability()
        self._pool_changed.set()

    def _replace(self, dead: _Worker) -> None:
        """A process ended (with its episode, or crashed): it is not restarted; the pool is topped up."""
        if dead in self._workers:
            self._workers.remove(dead)
        if dead in self._idle:
            self._idle.remove(dead)
        self._top_up()

    def _template_lost(self, template: TemplateProcess) -> None:
        """The template ended (its episode processes with it): start another, backing off while they die young."""
        assert template.process is not None
        if self._closing:
            return
        young = asyncio.get_running_loop().time() - template.started < YOUNG_DEATH_S
        self._young_deaths = self._young_deaths + 1 if young else 0
        logger.error("episode_template_exited pid=%d %s episode_processes_lost=%d", template.process.pid,
                     _exit_text(template.process.returncode), len(self._workers))
        self._notify_availability()
        task = asyncio.get_running_loop().create_task(self._restart_template(), name="ors-episode-template-restart")
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart_template(self) -> None:
        while not self._closing:
            await asyncio.sleep(self._backoff_s())
            template = TemplateProcess(self._setup, self._template_lost)
            try:
                await template.start()
            except WorkerStartupError as exc:
                self._log_start_failure("episode_template_restart_failed", exc)
                self._young_deaths += 1
                continue
            if self._closing:
                await template.stop()
                return
            self._template = template
            self._notify_availability()
            self._top_up()
            return

    async def close(self) -> None:
        """Stop every episode process, then the template (its end would kill them)."""
        await super().close()
        if self._template is not None:
            await self._template.stop()
