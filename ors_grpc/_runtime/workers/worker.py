"""A worker process: runs environments' code for the server that started it.

Started as `python -m ors_grpc._runtime.workers.worker SOCKET WORKER_ID
SERVER_PID`, or forked from the template with the environments imported
(`template`), it connects to the hop, learns what to import (`hop.Setup`)
and serves the server's calls, each in a task of its own, with the
in-process hosts (`local_hosts`). It ends when the hop closes, and is killed
with its parent (PR_SET_PDEATHSIG) even if its loop is stuck. A thread
watches its loop (`loop_monitor`) and another reports it every heartbeat
period on a connection of its own (`hop.Heartbeats`). Its log lines carry
`worker=N`; its spans nest under the server's. docs/workers.md has the design.
"""

from __future__ import annotations

import asyncio
import ctypes
import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Awaitable, NoReturn

from ors_grpc._runtime import garbage_collection, user_code
from ors_grpc._runtime.environment_host import EpisodeState
from ors_grpc._runtime.event_loop import fastest_event_loop
from ors_grpc._runtime.local_hosts import LocalEpisodeHost, LocalHosts
from ors_grpc._runtime.loop_monitor import LoopMonitor, warn_stall
from ors_grpc._runtime.workers.hop import (
    Framing, Heartbeat, Heartbeats, Hello, Ready, Setup, answer_frame, portable_error, read_frame, send_frame,
    write_frame,
)
from ors_grpc._runtime.workers.startup import load
from ors_grpc.authoring.types import JSONObject
from ors_grpc.observability import tracing
from ors_grpc.observability.log_lines import configure_logging

logger = logging.getLogger("ors_grpc.worker")

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when the thread of `parent_pid` that started it ends."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the call above
        os._exit(1)


class _Episodes:
    """The episodes living in this worker, by the server's episode id."""

    def __init__(self, environments: dict[str, type], toolsets: dict[str, type]) -> None:
        self.environments = environments
        self.toolsets = toolsets
        self.hosts = LocalHosts()
        self.live: dict[int, LocalEpisodeHost] = {}
        #: Episodes whose setup runs: ended during it, they are torn down after it.
        self.setting_up: set[int] = set()
        self.hosted_one = False
        self.exit_after_episode = False

    @property
    def idle_after_an_episode(self) -> bool:
        return self.hosted_one and not self.live and not self.setting_up

    def run(self, op: str, args: tuple) -> Awaitable[Any]:
        """The call `op` as an awaitable (the host's own coroutine: no coroutine of ours around it)."""
        if op == "run_tool":
            eid, name, tool_input = args
            return self.live[eid].run_tool(name, tool_input)
        if op == "catalog":
            env_name, method, call_args = args
            return getattr(self.hosts.catalog(self.environments[env_name]), method)(*call_args)
        eid, *rest = args
        if op == "construct":
            env_name, task_spec, secrets = rest
            host = self.live[eid] = self.hosts.episode(self.environments[env_name])
            self.hosted_one = True
            return self._construct(host, task_spec, secrets)
        if op == "teardown":
            return self._teardown(eid, *rest)
        host = self.live[eid]
        if op == "attach_toolset":
            return host.attach_toolset(self.toolsets[rest[0]])
        if op == "setup":
            return self._setup(eid, host)
        return getattr(host, op)(*rest)  # prompt, messages, task_tools, score_group

    def end(self, eid: int) -> None:
        """The episode is over: forgotten at once, unless its setup still runs (which tears it down once it
        ends) or it was set up and defines a teardown (the server's `teardown` call follows). Handled in the
        frame's callback: it runs no environment code."""
        host = self.live.get(eid)
        if host is not None:
            host.end()
            if eid not in self.setting_up and not (host.set_up and host.implements("teardown")):
                del self.live[eid]

    @staticmethod
    async def _construct(host: LocalEpisodeHost, task_spec: JSONObject, secrets: dict[str, str]) -> tuple[bool, bool]:
        """Construct the environment; answers whether it defines `setup()` and `teardown()` (the server
        sends neither step when it does not)."""
        await host.construct(task_spec, secrets)
        if host.env is None:  # ended meanwhile: no step follows
            return False, False
        return host.implements("setup"), host.implements("teardown")

    async def _teardown(self, eid: int, set_up_by_the_server: bool) -> None:
        """The episode is over (the server sends no `end` before the teardown of one it saw set up): tear it
        down, or leave that to the setup still running. `set_up_by_the_server`: its environment defines no
        `setup()`, so the server set it up without a crossing; it is set up here first (no code runs)."""
        host = self.live.get(eid)
        if host is not None:
            if set_up_by_the_server:
                await host.setup()
            host.end()
            if eid not in self.setting_up:
                await self._tear_down(eid, host)

    async def _setup(self, eid: int, host: LocalEpisodeHost) -> None:
        """Set the episode up."""
        self.setting_up.add(eid)
        try:
            await host.setup()
        finally:
            self.setting_up.discard(eid)
            if host.state is EpisodeState.ENDED:  # the server gave up on it meanwhile
                await self._tear_down(eid, host)

    async def _tear_down(self, eid: int, host: LocalEpisodeHost) -> None:
        self.live.pop(eid, None)
        await host.teardown()


async def _exit_once_sent(hop: Framing) -> None:
    """`--isolation episode`: the process ends with its episode, once its answers left."""
    await hop.drain()
    _exit()


def _connect(socket_path: str) -> socket.socket:
    """A connection to the hop, made with a blocking connect: while the server's backlog is full (a burst
    of starts) it waits for room, where asyncio's non-blocking connect would take EAGAIN for success
    and fail at the first send (ENOTCONN)."""
    connection = socket.socket(socket.AF_UNIX)
    connection.connect(socket_path)
    connection.setblocking(False)
    return connection


async def serve(socket_path: str, worker_id: int) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=_connect(socket_path))
    write_frame(writer, Hello(worker_id, os.getpid()))
    setup: Setup = await read_frame(reader)
    sys.path[:] = setup.sys_path
    configure_logging(setup.log_level, worker=str(worker_id), force=True)
    tracing.enabled()  # as the server decided, from the same OTEL_* environment
    try:
        environments = {name: load(spec) for name, spec in setup.environments.items()}
        toolsets = {spec: load(spec) for spec in setup.toolsets}
    except BaseException:
        write_frame(writer, Ready(error=traceback.format_exc()))
        await writer.drain()
        return
    garbage_collection.settle()
    write_frame(writer, Ready())
    closed = asyncio.get_running_loop().create_future()
    calls = _Calls(_Episodes(environments, toolsets))
    calls.episodes.exit_after_episode = setup.exit_after_episode
    calls.hop = Framing(calls.received, lambda: closed.done() or closed.set_result(None))
    calls.hop.take_over(writer)  # now: the server sends nothing before it has read Ready
    _watch_the_loop(socket_path, worker_id, setup.heartbeat_interval_s)
    await closed  # the server closed the hop: it stopped, or died


class _Calls:
    """The server's calls, each in a task of its own as its frame arrives (environments' async code
    needs its own current task: asyncio.timeout, anyio); `cancel` cancels one."""

    def __init__(self, episodes: _Episodes) -> None:
        self.episodes = episodes
        self.hop: Framing
        self._loop = asyncio.get_running_loop()
        self._running: dict[int, asyncio.Task[None]] = {}

    def received(self, message: tuple) -> None:
        call_id, op, args, *trace_context = message
        if op == "cancel":
            task = self._running.get(args[0])
            if task is not None:
                task.cancel()
            return
        if op == "end":
            self.episodes.end(args[0])
            if self.episodes.exit_after_episode and self.episodes.idle_after_an_episode:
                self._loop.create_task(_exit_once_sent(self.hop))
            return
        self._running[call_id] = self._loop.create_task(self._answer(call_id, op, args, trace_context))

    async def _answer(self, call_id: int, op: str, args: tuple, trace_context: list[dict[str, str]]) -> None:
        """Run call `op` and send its answer; forget its task once it is over (no done callback: one turn
        of the loop less per call)."""
        hop, episodes = self.hop, self.episodes
        try:
            if trace_context:  # tracing is on in the server: this call's spans are children of its span
                tracing.continue_trace(trace_context[0])
            try:
                value = await episodes.run(op, args)
            except asyncio.CancelledError:  # the server stopped waiting (a timeout, the episode ended)
                hop.send((call_id, False, RuntimeError("the call was cancelled")))
                return
            except Exception as exc:
                hop.send((call_id, False, portable_error(exc)))
                return
            try:
                hop.send(answer_frame(call_id, value))
            except Exception as exc:  # a result that cannot be pickled
                hop.send((call_id, False, portable_error(TypeError(f"cannot send the result: {exc}"))))
        finally:
            self._running.pop(call_id, None)
        if episodes.exit_after_episode and episodes.idle_after_an_episode:
            await _exit_once_sent(hop)


def _watch_the_loop(socket_path: str, worker_id: int, heartbeat_interval_s: float) -> None:
    """Measure this worker's loop lag off the loop; report it to the server every
    `heartbeat_interval_s` (0: the server watches no stall limit)."""
    monitor = LoopMonitor(asyncio.get_running_loop(), on_stall=warn_stall)
    monitor.start()
    if heartbeat_interval_s:
        threading.Thread(target=_send_heartbeats, args=(socket_path, worker_id, monitor, heartbeat_interval_s),
                         name="ors-heartbeat", daemon=True).start()


def _send_heartbeats(socket_path: str, worker_id: int, monitor: LoopMonitor, interval_s: float) -> None:
    """The heartbeat thread: a blocking socket of its own, so a stuck loop cannot hold the heartbeats back."""
    try:
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(socket_path)
            send_frame(connection, Heartbeats(worker_id, os.getpid()))
            while True:
                send_frame(connection, Heartbeat(monitor.lag_s(), monitor.held_s()))
                time.sleep(interval_s)
    except OSError:
        return  # the server is gone: the hop's end stops this worker


def main() -> None:
    socket_path, worker_id, parent_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    run(socket_path, worker_id, parent_pid)


def run(socket_path: str, worker_id: int, parent_pid: int) -> NoReturn:
    """Serve as worker `worker_id` on the hop at `socket_path`, killed with `parent_pid` (this process's parent)."""
    die_with_parent(parent_pid)
    faulthandler.enable(all_threads=False)  # a fatal signal prints where environments' code was, in the server's log
    user_code.cancelled_calls_wait_for_their_thread = True  # the server judges how long they run on
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server decides
    with asyncio.Runner(loop_factory=fastest_event_loop()) as runner:  # the server's loop, uvloop
        runner.run(serve(socket_path, worker_id))
    _exit()  # sync code still running in threads must not keep a worker alive after its server


def _exit() -> None:
    """End the process now, with the spans it made exported (os._exit skips the SDK's flush)."""
    tracing.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
