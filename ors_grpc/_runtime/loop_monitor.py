"""How late an event loop runs what it is given, measured from outside it.

A daemon thread sends the loop a probe (`call_soon_threadsafe`) every
`PROBE_INTERVAL_S`; while a probe waits the lag is "now - sent", so a loop
blocked for good shows a lag that keeps growing (a heartbeat sent from the
loop itself would just stop). A stall over `STALL_WARNING_S` is one WARNING
naming the environment's function that holds the loop, when the same call
is seen running in two looks in a row (load, many quick calls, never is).
Worker processes report it in their heartbeats. The argument:
docs/architecture.md, "The service"; the stall limit: docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import sys
import threading
import time
from typing import Any, Callable, Optional

from ors_grpc._runtime.user_code import user_code_call_in

__all__ = ["PROBE_INTERVAL_S", "STALL_WARNING_S", "LoopMonitor", "describe_user_code", "monitor_loop",
           "warn_stall"]

logger = logging.getLogger("ors_grpc.loop_monitor")

#: How often the loop is probed, and how often an unanswered probe is looked at.
PROBE_INTERVAL_S = 0.1
#: A loop held this long is a stall worth a WARNING (asyncio's debug mode
#: reports callbacks over 0.1 s; a second is a bug, not load).
STALL_WARNING_S = 1.0


def describe_user_code(fn: Optional[Callable[..., Any]]) -> tuple[str, str]:
    """(environment or toolset class, function) of a user function:
    `("EchoEnv", "echo")` for a bound tool, `("EchoEnv", "list_tasks")` for a
    classmethod, `("EchoEnv", "__init__")` for a constructor."""
    if fn is None:
        return "-", "-"
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isclass(fn):
        return fn.__name__, "__init__"
    owner = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", repr(fn))
    if owner is not None:
        return (owner if inspect.isclass(owner) else type(owner)).__name__, name
    qualname = getattr(fn, "__qualname__", name)
    owner_name, _, _ = qualname.rpartition(".")
    return owner_name or "-", name


class LoopMonitor:
    """Measures `loop`'s lag from a daemon thread (`start`, `stop`).

    `on_stall(lag_s, holder)` is called (in the monitor's thread) at most
    once per stall: once an unanswered probe has waited `stall_s`, as soon as
    one user call is seen holding the loop in two looks in a row; `holder` is
    its user function.

    `held_s()` tells a stall from load: the lag says how late the loop runs
    what it is given, which many quick callbacks can make long (under CPU-heavy
    threads each of the loop's many GIL hand-overs waits its turn); the time
    one callback has held the loop grows only while a single callback runs
    (a blocking call in an `async def`, a spin, a slow sync call on the loop).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        interval_s: float = PROBE_INTERVAL_S,
        stall_s: float = STALL_WARNING_S,
        on_stall: Optional[Callable[[float, Callable[..., Any]], None]] = None,
    ) -> None:
        self.loop = loop
        self.interval_s = interval_s
        self.stall_s = stall_s
        self.on_stall = on_stall
        #: The largest lag seen since the start (or the last `reset_max_lag`), in seconds.
        self.max_lag_s = 0.0
        self._last_lag_s = 0.0
        self._sent: Optional[float] = None  # when the unanswered probe was sent
        self._answered = threading.Event()
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._loop_thread_id: Optional[int] = None  # learnt from the first probe
        self._held_since: Optional[float] = None  # when the callback running now was first seen running
        #: The frame that runs the loop, beneath each callback's own (uvloop's; None on the stdlib loop).
        self._beneath: Any = None

    def lag_s(self) -> float:
        """The loop's lag now: how long the unanswered probe has waited, else
        how late the last one ran."""
        sent = self._sent
        return time.monotonic() - sent if sent is not None else self._last_lag_s

    def held_s(self) -> float:
        """How long the callback running on the loop now has run, as far as the
        looks while a probe waits saw it (0 while probes are answered in time)."""
        since = self._held_since
        return time.monotonic() - since if since is not None else 0.0

    def reset_max_lag(self) -> float:
        """`max_lag_s`, then start it afresh (e.g. once per heartbeat)."""
        peak, self.max_lag_s = max(self.max_lag_s, self.lag_s()), 0.0
        return peak

    def _user_call(self) -> Optional[tuple[Any, Callable[..., Any]]]:
        """(frame, function) of the user call running on the loop now, or None."""
        thread_id = self._loop_thread_id
        return None if thread_id is None else user_code_call_in(thread_id)

    def _running_callback(self) -> Any:
        """The frame of the callback running on the loop now, or None: the same object for as long
        as that one callback runs, a new one for the next. The stdlib loop runs each callback in a
        frame of `Handle._run`; uvloop runs it from C, so its outermost frame is the one whose caller
        is the frame that runs the loop (`_beneath`). A task's steps share their coroutine's frame,
        but a loop runs a task at most once per turn, and the probe waits for at most two turns."""
        thread_id = self._loop_thread_id
        frame = None if thread_id is None else sys._current_frames().get(thread_id)
        beneath = self._beneath
        while frame is not None and frame.f_code is not _HANDLE_RUN:
            caller = frame.f_back
            if caller is not None and caller is beneath:
                return frame
            frame = caller
        return frame

    def _look_at_callback(self, held_by: Any) -> Any:
        """Note the callback running now; its clock starts when it was not running at the last look."""
        callback = self._running_callback()
        if callback is not held_by:
            self._held_since = None if callback is None else time.monotonic()
        return callback

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ors-loop-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._answered.set()

    def _answer(self) -> None:  # on the loop
        self._loop_thread_id = threading.get_ident()
        caller = sys._getframe(1)  # what runs the loop (uvloop), or the callback's Handle._run (stdlib)
        self._beneath = caller if caller.f_code is not _HANDLE_RUN else None
        self._answered.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._answered.clear()
            self._sent = sent = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(self._answer)
            except RuntimeError:  # the loop is closed
                return
            stalled = reported = False
            seen = None  # the user call seen holding the loop at the last look
            held_by = None  # the callback seen running at the last look
            while not self._answered.wait(self.interval_s):
                if self.loop.is_closed():
                    return
                if not self.loop.is_running():  # a stopped loop is not a stalled one: measure afresh
                    self._sent = sent = time.monotonic()
                    continue
                lag = time.monotonic() - sent
                self.max_lag_s = max(self.max_lag_s, lag)
                held_by = self._look_at_callback(held_by)
                if reported or lag < self.stall_s - self.interval_s:  # the first look a probe before
                    continue
                call = self._user_call()
                if lag >= self.stall_s:
                    stalled = True
                    if call is not None and seen is not None and call[0] is seen[0]:
                        reported = True
                        if self.on_stall is not None:
                            self.on_stall(lag, call[1])
                seen = call
            self._last_lag_s = lag = time.monotonic() - sent
            self._sent = self._held_since = None
            self.max_lag_s = max(self.max_lag_s, lag)
            if stalled and not self._stopped.is_set():
                logger.info("event_loop_stall_ended seconds=%.2f%s", lag,
                            "" if reported else " (no one call of environment code held it throughout)")
            self._stopped.wait(self.interval_s)


#: The code every callback of the stdlib's event loops runs in (a callback's frame of it is the
#: callback's identity while it runs; uvloop's callbacks have none).
_HANDLE_RUN = asyncio.events.Handle._run.__code__


def warn_stall(lag_s: float, holder: Callable[..., Any]) -> None:
    environment, function = describe_user_code(holder)
    logger.warning(
        "event_loop_stalled seconds=%.1f environment=%s function=%s (still blocked: every episode of this "
        "process waits; blocking code belongs in a sync function or `await asyncio.to_thread(...)`)",
        lag_s, environment, function)


# One monitor per loop, however many servers it runs (tests start several).
_monitors: dict[asyncio.AbstractEventLoop, tuple[LoopMonitor, int]] = {}
_monitors_lock = threading.Lock()


def monitor_loop(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """Watch `loop` for stalls, warning as the module says; returns the
    function that stops watching (the monitor ends with its last user)."""
    with _monitors_lock:
        monitor, users = _monitors.get(loop, (None, 0))
        if monitor is None:
            monitor = LoopMonitor(loop, on_stall=warn_stall)
            monitor.start()
        _monitors[loop] = (monitor, users + 1)

    def release() -> None:
        with _monitors_lock:
            current, count = _monitors.get(loop, (None, 0))
            if current is not monitor:
                return
            if count <= 1:
                del _monitors[loop]
                monitor.stop()
            else:
                _monitors[loop] = (monitor, count - 1)

    return functools.partial(_release_once, [release])


def _release_once(pending: list[Callable[[], None]]) -> None:
    while pending:
        pending.pop()()
