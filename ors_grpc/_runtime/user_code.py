"""Where environments' code runs: on the event loop or in a thread.

Async user code is awaited on the loop. A synchronous function can run on
the loop, as the reference SDK runs all of it (cheaper for quick code: no
thread hand-off, no wait for the GIL), or in a thread (safer for slow code,
which would stall every session while on the loop).
`Environment.sync_code_on_loop` chooses: True (the loop), False (a thread),
or None, the default, where each function earns its place (`_Placement`).
For authors: docs/authoring.md, "Where synchronous code runs".
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import gc
import inspect
import logging
import sys
import threading
import time
import types
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

__all__ = ["busy_user_code_threads", "run_user_code", "runs_in_thread", "user_code_call_in"]

logger = logging.getLogger("ors_grpc.user_code")

# User code may block for long (loading data, starting containers): give it a
# pool of its own, larger than the loop's default (cpu + 4 threads), so a few
# slow episodes do not starve the others. Threads are created on demand.
_USER_CODE_THREADS = 64
_executor: ThreadPoolExecutor | None = None

_busy_threads = 0
_busy_lock = threading.Lock()

#: Whether a cancelled call whose code runs in a thread ends only when the
#: thread does (set in worker processes, whose server kills the worker when
#: a cancelled call runs past a grace), rather than at once.
cancelled_calls_wait_for_their_thread = False

#: A sync call that finishes within this many seconds is quick enough for the
#: loop. It is well under the 5 ms for which a CPU-bound Python thread holds
#: the GIL (and so stalls the loop anyway) before it must let go.
INLINE_BUDGET_S = 0.002
#: Consecutive quick calls in user-code threads before a function first moves
#: to the loop.
TRIAL_CALLS = 8
#: Consecutive quick calls on the loop after which a function's next trial
#: is halved again (down to TRIAL_CALLS): a rare overrun (the machine
#: paused the process) is forgiven, code slow more often than this is not.
FORGIVE_AFTER_CALLS = 1000


class _GarbageCollectionClock:
    """Seconds spent in garbage collection so far, in any thread. A full
    collection can take tens of milliseconds; a call it interrupts is not
    slow for it, so calls are timed without it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


_gc_clock = _GarbageCollectionClock()


def _elapsed_without_gc(started: float, gc_before: float) -> float:
    return time.perf_counter() - started - (_gc_clock.seconds - gc_before)


class _Placement:
    """Where one sync function runs, when its environment leaves it to us.

    It runs in user-code threads until `trial_calls` consecutive calls have each
    returned within `INLINE_BUDGET_S`; then on the loop. An overrun in a
    thread starts the trial over (a thread waiting for the GIL looks slow
    too, so one overrun proves little). An overrun on the loop, the one stall
    slow code can cause, sends it back to threads with a trial twice as long;
    `FORGIVE_AFTER_CALLS` quick calls on the loop halve it again. So code
    that is slow more than about once in a thousand calls ends up in threads,
    and quick code survives the odd pause of the process.
    """

    __slots__ = ("name", "quick_calls", "trial_calls")

    def __init__(self, name: str) -> None:
        self.name = name
        self.quick_calls = 0
        self.trial_calls = TRIAL_CALLS

    @property
    def on_loop(self) -> bool:
        return self.quick_calls >= self.trial_calls

    def record(self, seconds: float) -> None:
        """Account for one call that took `seconds` (wherever it ran)."""
        if seconds > INLINE_BUDGET_S:
            if self.on_loop:
                self.trial_calls *= 2
                # A few milliseconds now and then is the machine pausing the
                # process; 100 ms is asyncio's own threshold for a slow callback.
                level = logging.WARNING if seconds >= 0.1 else logging.DEBUG
                logger.log(level, "sync_code_stalled_loop function=%s ms=%.1f next_trial_calls=%d",
                           self.name, seconds * 1000, self.trial_calls)
            self.quick_calls = 0
            return
        self.quick_calls += 1
        if self.quick_calls == self.trial_calls:
            logger.debug("sync_code_moves_to_loop function=%s", self.name)
        elif self.quick_calls >= self.trial_calls + FORGIVE_AFTER_CALLS and self.trial_calls > TRIAL_CALLS:
            self.trial_calls //= 2
            self.quick_calls = self.trial_calls  # still on the loop, counting afresh


# Keyed by the function itself, so the placement outlives any one bound
# method or partial, and dies with the code (environments may be classes
# defined at run time).
_placements: weakref.WeakKeyDictionary[Any, _Placement] = weakref.WeakKeyDictionary()


def _placement(fn: Callable[..., Any]) -> _Placement | None:
    """`fn`'s placement record; None for callables that cannot be weakly
    referenced (some builtins), which always run in a thread."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__func__", fn)
    try:
        placement = _placements.get(code)
        if placement is None:
            placement = _placements[code] = _Placement(getattr(code, "__qualname__", repr(code)))
    except TypeError:
        return None
    return placement


def _decide(fn: Callable[..., Any], on_loop: bool | None) -> tuple[bool, _Placement | None]:
    """Where a plain function runs if called now: (in a user-code thread, the
    placement record to account the call to; None when the environment
    pinned the choice or `fn` has no record)."""
    if on_loop is not None:
        return not on_loop, None
    placement = _placement(fn)
    return placement is None or not placement.on_loop, placement


def runs_in_thread(fn: Callable[..., Any], on_loop: bool | None) -> bool:
    """Whether `run_user_code(fn, on_loop=on_loop)`, called now, runs `fn` in
    a user-code thread (where cancelling the caller cannot interrupt it)."""
    return not inspect.iscoroutinefunction(fn) and _decide(fn, on_loop)[0]


async def run_user_code(
    fn: Callable[..., Any],
    *args: Any,
    sync_lock: asyncio.Lock | None = None,
    on_loop: bool | None = None,
) -> Any:
    """Call user code: await coroutine functions; run plain functions on the
    loop or in a user-code thread as `on_loop` (an environment's
    `sync_code_on_loop`) says, awaiting what they may return.

    `sync_lock`, an episode's lock, keeps its synchronous code to one call at
    a time: under the reference SDK sync code runs on the event loop and
    never overlaps, and environments written for it may rely on that.
    """
    if _is_coroutine_function(fn):
        return await fn(*args)
    in_thread, placement = _decide(fn, on_loop)  # on entry, as `runs_in_thread` answers
    if on_loop:
        result = fn(*args)  # all of the environment's sync code is on the loop: none can overlap
    else:
        async with sync_lock or contextlib.nullcontext():
            if in_thread:
                result = await _in_thread(placement, fn, args)
            else:
                assert placement is not None  # only a placement puts unpinned code on the loop
                result = _timed_on_loop(placement, fn, args)
    if inspect.isawaitable(result):
        result = await result
    return result


def _is_coroutine_function(fn: Callable[..., Any]) -> bool:
    """`inspect.iscoroutinefunction(fn)`; for a method of a plain function
    (most calls: tools, get_prompt) read off its code's flags, which is what
    inspect's five Python calls come to (a few thousand instructions a call)."""
    func = getattr(fn, "__func__", None)
    # (Unless marked by 3.12's inspect.markcoroutinefunction, which inspect also reads.)
    if type(func) is types.FunctionType and "_is_coroutine_marker" not in func.__dict__:
        return bool(func.__code__.co_flags & inspect.CO_COROUTINE)
    return inspect.iscoroutinefunction(fn)


def user_code_call_in(thread_id: int) -> tuple[Any, Callable[..., Any]] | None:
    """The `run_user_code` call running in thread `thread_id` (the event
    loop's) at this instant, seen from another thread: (its frame, which is
    the call's identity while it lives, and its user function `fn`), from the
    innermost `run_user_code` frame on the thread's stack. That is sync code
    on the loop, or a step of an `async def` (a resumed coroutine is on the
    stack of whoever resumed it); code in a user-code thread is not (its caller
    is suspended). None when the thread runs no user code (our own code).
    Read off the stack, so the call path pays nothing for it."""
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if frame.f_code is _RUN_USER_CODE:
            return frame, frame.f_locals.get("fn")
        frame = frame.f_back
    return None


def _timed_on_loop(placement: _Placement, fn: Callable[..., Any], args: tuple) -> Any:
    started, gc_before = time.perf_counter(), _gc_clock.seconds
    try:
        return fn(*args)
    finally:
        placement.record(_elapsed_without_gc(started, gc_before))


async def _in_thread(placement: _Placement | None, fn: Callable[..., Any], args: tuple) -> Any:
    # A call that raises is not counted: it neither earns nor costs a place.
    loop = asyncio.get_running_loop()
    # In the caller's context, as asyncio.to_thread runs it: spans the code opens nest under the call's.
    running = loop.run_in_executor(_user_code_executor(), contextvars.copy_context().run, _counted, fn, args)
    if not cancelled_calls_wait_for_their_thread:
        result, seconds = await running
    else:
        try:
            result, seconds = await asyncio.shield(running)
        except asyncio.CancelledError:
            await asyncio.wait({running})  # a thread cannot be stopped: the call ends when it does
            raise
    if placement is not None:
        placement.record(seconds)
    return result


def _user_code_executor() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(_USER_CODE_THREADS, thread_name_prefix="ors-user-code")
    return _executor


def _counted(fn: Callable[..., Any], args: tuple) -> tuple[Any, float]:
    """Run `fn` in this user-code thread: its result and how long it took."""
    global _busy_threads
    with _busy_lock:
        _busy_threads += 1
    started, gc_before = time.perf_counter(), _gc_clock.seconds
    try:
        return fn(*args), _elapsed_without_gc(started, gc_before)
    finally:
        with _busy_lock:
            _busy_threads -= 1


_RUN_USER_CODE = run_user_code.__code__


def busy_user_code_threads() -> int:
    """How many user-code threads are running user code now (a sync tool or
    setup that outlived its episode cannot be interrupted)."""
    return _busy_threads
