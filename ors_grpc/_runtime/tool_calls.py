"""Tool calls of one session, run as tasks that outlive the RPC that started them.

A call gets a task id (uuid4 hex) at once; the tool then runs in its own
asyncio task, so a client that drops its stream cancels only its watching,
never the tool, and can attach again by task id. A finished call's outcome
stays attachable for `linger_s`. Task ids belong to their session: the
registry is per session, so another session cannot find them. Group
scorings (ScoreGroup) run the same way, beside the tool calls.

The episode invariants live here too: once a tool returned `finished=True`
further calls are refused (and a call that ran meanwhile gets the same
refusal: the first finished result wins); calls to the same tool run one at
a time, unless the tool is `concurrent`; an `exclusive` or terminal tool runs
alone in its session (see `exclusive_gate`, which only sessions with such a
tool have).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import logging
import time
from typing import Any, Awaitable, Callable, NamedTuple, Sequence

from ors_grpc.observability import metrics, tracing
from ors_grpc._generated.ors.v1 import errors_pb2, types_pb2
from ors_grpc._runtime.episode_record import EpisodeRecorder
from ors_grpc._runtime.environment_host import EpisodeHost
from ors_grpc.protocol import convert, json_text
from ors_grpc.protocol.errors import ORSError, bounded_text
from ors_grpc.protocol.random_ids import uuid4_hex
from ors_grpc._runtime.exclusive_gate import ExclusiveGate
from ors_grpc._runtime.server_stats import EnvironmentCounters
from ors_grpc.authoring.types import GroupCandidate, GroupScore, RunToolError, RunToolOutput

__all__ = ["CallOutcome", "SessionToolCalls", "ToolCallTask", "call_fingerprint"]

logger = logging.getLogger("ors_grpc.tool_calls")

#: The refusal of a call after the episode finished, as openreward words it.
EPISODE_FINISHED = (
    "{name!r} was not run: the episode has finished (a tool returned finished=True), "
    "so no further tool calls are accepted."
)
#: The kinds of work a task id may name; attaching checks it.
TOOL_CALL, SCORE_GROUP = "tool call", "group scoring"
# Seconds `release` waits for cancelled tool calls to end.
RELEASE_WAIT_S = 10.0
#: Longest task id a client may choose (RunEpisode's call_tool steps).
MAX_TASK_ID_LENGTH = 128


class CallOutcome(NamedTuple):
    """A call's end: the tool's result (or tool-level error) or a scoring's
    scores, else the message of the exception it raised, else the error the
    call answers as a status (its environment's process ended under it).
    (A named tuple: immutable, and made in half the time of a frozen
    dataclass, twice a call.)"""

    result: RunToolOutput | list[GroupScore] | None = None
    failure: str | None = None
    #: A tool call's `result` as its message, made once when the call ended.
    message: types_pb2.RunToolResult | None = None
    #: `message`'s size in bytes, measured once: the record keeps it, answers are bounded by it.
    message_bytes: int = 0
    #: ENVIRONMENT_CRASHED: the process holding the environment ended while
    #: the call ran; every door answers it as that status, not as a failure.
    error: ORSError | None = None

    @property
    def failed_because(self) -> str | None:
        """Why the call produced no result (a failure's or an error's message), None when it did."""
        return self.error.message if self.error is not None else self.failure


def _refused_as_finished(name: str) -> CallOutcome:
    return CallOutcome(result=RunToolOutput(RunToolError(error=EPISODE_FINISHED.format(name=name),
                                                         reason="episode_finished")))


async def _at_once(outcome: CallOutcome) -> CallOutcome:
    return outcome


def _crashed(exc: Exception) -> ORSError | None:
    """`exc` if it says the environment's process ended under the call (the
    host raised ENVIRONMENT_CRASHED): not the tool's failure, the episode's end."""
    if isinstance(exc, ORSError) and exc.reason == errors_pb2.ERROR_REASON_ENVIRONMENT_CRASHED:
        return exc
    return None


def call_fingerprint(kind: str, name: str, tool_input: Any) -> str:
    """What an idempotency key is bound to: the kind of call (`tool`,
    `score_group`), its name (none for a scoring) and its input (a tool's
    input, a scoring's candidates) as canonical JSON (keys sorted), hashed."""
    text = json_text.canonical([kind, name, tool_input])
    return hashlib.sha256(text.encode()).hexdigest()


def _wake(waiter: asyncio.Future[None], _: asyncio.Task[Any]) -> None:
    if not waiter.done():  # (a cancelled wait)
        waiter.set_result(None)


async def _until_done(task: asyncio.Task[Any]) -> None:
    """Returns once `task` is done; cancelling this wait leaves the task
    running. What `asyncio.wait({task})` does, for a third of its cost
    (30,000 instructions, on every tool call): a future of the waiter's own
    is awaited, woken by the task's end."""
    if task.done():
        return
    waiter = task.get_loop().create_future()
    wake = functools.partial(_wake, waiter)
    task.add_done_callback(wake)
    try:
        await waiter
    finally:
        task.remove_done_callback(wake)


class ToolCallTask:
    """One tool call (or group scoring), running or finished."""

    #: The call's `call_fingerprint` when it was started under an idempotency key.
    fingerprint: str | None = None

    def __init__(
        self, task_id: str, task: asyncio.Task[CallOutcome], kind: str = TOOL_CALL,
        ended: asyncio.Future[None] | None = None,
    ) -> None:
        self.task_id = task_id
        self._task = task
        self.kind = kind
        #: Woken by the call's own task as it ends, for the first wait (its
        #: starter's): no done callbacks, one turn of the loop fewer.
        self._ended = ended

    @property
    def done(self) -> bool:
        return self._task.done()

    async def outcome(self) -> CallOutcome:
        """Wait for the outcome. Cancelling this wait leaves the tool running."""
        ended, self._ended = self._ended, None
        if ended is not None:
            await ended  # (cancelling this wait cancels only `ended`)
        if not self._task.done():  # a later wait, or the task was cancelled before it ran
            await _until_done(self._task)
        if self._task.cancelled():  # only `release` cancels: the session ended
            raise ORSError(errors_pb2.ERROR_REASON_SESSION_DELETED, "Session deleted")
        return self._task.result()

    def cancel(self) -> asyncio.Task[CallOutcome]:
        """Cancel the tool's task; returns it, to wait for its end."""
        self._task.cancel()
        _wake_once(self._ended)  # a task cancelled before it ran never wakes it
        return self._task


def _wake_once(ended: asyncio.Future[None] | None) -> None:
    if ended is not None and not ended.done():  # (done: woken already, or its wait was cancelled)
        ended.set_result(None)


class SessionToolCalls:
    """The tool calls of one session: start, attach, release."""

    def __init__(
        self, *, linger_s: float, timeout_s: float | None, redact: Any = str,
        gate: ExclusiveGate | None = None, counters: EnvironmentCounters | None = None,
        record: EpisodeRecorder | None = None,
    ) -> None:
        self._linger_s = linger_s
        #: The environment's live-view counters (server_stats), if the server keeps them.
        self._counters = counters
        #: The episode's record, where every tool call is written down.
        self._record = record
        self._timeout_s = timeout_s
        self._redact = redact
        self._calls: dict[str, ToolCallTask] = {}
        #: Finished calls, in the order they finished: (loop time to forget it, task id).
        self._lingering: collections.deque[tuple[float, str]] = collections.deque()
        #: The one timer that forgets them, due for the first (set while any lingers).
        self._forget_timer: asyncio.TimerHandle | None = None
        self._tool_locks: dict[str, asyncio.Lock] = {}
        #: Only for sessions with an exclusive tool: other calls then pass it shared.
        self._gate = gate
        self.finished = False
        #: monotonic time the last call completed (counts as session activity).
        self.last_completed = 0.0

    @property
    def in_flight(self) -> bool:
        return any(not call.done for call in self._calls.values())

    def start(
        self, host: EpisodeHost, name: str, tool_input: dict[str, Any], *, task_id: str | None = None,
        input_json: str | None = None,
    ) -> ToolCallTask:
        """Runs a call under `task_id` (the client's choice), else a new one.
        `input_json`: `tool_input` as the request's JSON text, for the record."""
        return self._start(lambda: self._recorded_run(host, name, tool_input, input_json), f"ors-tool-{name}",
                           task_id, TOOL_CALL)

    def start_scoring(
        self, host: EpisodeHost, candidates: Sequence[GroupCandidate], *, task_id: str | None = None
    ) -> ToolCallTask:
        """Runs the environment's `score_group(candidates)` as a call would run (a task id,
        apart from the stream), under `task_id` or a new one."""
        return self._start(lambda: self._score(host, candidates), "ors-score-group", task_id, SCORE_GROUP)

    def _start(
        self, work: Callable[[], Awaitable[CallOutcome]], label: str, task_id: str | None, kind: str
    ) -> ToolCallTask:
        if task_id is None:
            task_id = uuid4_hex()
        elif not 0 < len(task_id) <= MAX_TASK_ID_LENGTH:
            raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST,
                           f"task_id must be 1 to {MAX_TASK_ID_LENGTH} characters")
        elif task_id in self._calls:
            raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST, "task_id is already in use in this session")
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        task = loop.create_task(self._tracked(work(), task_id, ended), name=f"{label}-{task_id}")
        call = ToolCallTask(task_id, task, kind, ended)
        self._calls[task_id] = call
        return call

    async def _tracked(self, work: Awaitable[CallOutcome], task_id: str, ended: asyncio.Future[None]) -> CallOutcome:
        """A call's task: `work`, then its end noted and `ended` woken, by
        the task itself rather than by done callbacks (which cost a turn of
        the loop each): nothing runs between this and the task's end."""
        try:
            return await work
        finally:
            self._on_done(task_id)
            _wake_once(ended)

    def run_once(self, key: str, fingerprint: str, start: Callable[[str], ToolCallTask]) -> ToolCallTask:
        """The call of idempotency key `key`: the one already started under
        it (same fingerprint, else IDEMPOTENCY_KEY_REUSED), else a new one,
        `start(key)`, with `key` as its task id. Shared by every kind of call
        that takes a key (CallTool, ScoreGroup)."""
        if len(key) > MAX_TASK_ID_LENGTH:
            raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST,
                           f"idempotency_key must be 1 to {MAX_TASK_ID_LENGTH} characters")
        call = self._calls.get(key)
        if call is None:
            call = start(key)
            call.fingerprint = fingerprint
        elif call.fingerprint != fingerprint:
            raise ORSError(errors_pb2.ERROR_REASON_IDEMPOTENCY_KEY_REUSED,
                           "this idempotency key already names another call of this session "
                           "(another tool, input or candidates)")
        return call

    def attach(self, task_id: str, kind: str = TOOL_CALL) -> ToolCallTask:
        """The call of `task_id`, if it is of this kind (a tool call's id does
        not attach a scoring, nor the other way round)."""
        call = self._calls.get(task_id)
        if call is None or call.kind != kind:
            raise ORSError(errors_pb2.ERROR_REASON_UNKNOWN_TASK_ID, "unknown task_id")
        return call

    async def release(self) -> None:
        """Cancel running calls and forget every call (the session ended)."""
        if self._forget_timer is not None:
            self._forget_timer.cancel()
            self._forget_timer = None
        self._lingering.clear()
        calls, self._calls = list(self._calls.values()), {}
        cancelled = {call.cancel() for call in calls if not call.done}
        if cancelled:
            # Bounded: a tool that swallows its cancellation must not hang deletion.
            _, still_running = await asyncio.wait(cancelled, timeout=RELEASE_WAIT_S)
            if still_running:
                logger.warning("tool_calls_ignored_cancellation count=%d", len(still_running))

    def _on_done(self, task_id: str) -> None:
        self.last_completed = time.monotonic()
        if task_id in self._calls:
            # One timer per session, not per call (a timer costs more than the rest of this): every
            # call lingers as long, so they are forgotten in the order they finished.
            loop = asyncio.get_running_loop()
            self._lingering.append((loop.time() + self._linger_s, task_id))
            if self._forget_timer is None:
                self._forget_timer = loop.call_at(self._lingering[0][0], self._forget_lingered)

    def _forget_lingered(self) -> None:
        """Forget the finished calls whose linger is over; the timer is set again for the next one."""
        loop = asyncio.get_running_loop()
        now, lingering = loop.time(), self._lingering
        self._calls.pop(lingering.popleft()[1], None)  # the one the timer was set for (it may fire a hair early)
        while lingering and lingering[0][0] <= now:
            self._calls.pop(lingering.popleft()[1], None)
        self._forget_timer = loop.call_at(lingering[0][0], self._forget_lingered) if lingering else None

    async def _recorded_run(
        self, host: EpisodeHost, name: str, tool_input: dict[str, Any], input_json: str | None
    ) -> CallOutcome:
        """`_run`, written down in the episode's record; the outcome carries its result message."""
        record = self._record
        call = record.call_started(name, tool_input, input_json) if record is not None else None
        try:
            outcome = await self._run(host, name, tool_input)
        except asyncio.CancelledError:
            if record is not None and call is not None:
                record.call_failed(call, "the call was stopped: the session ended")
            raise
        if outcome.result is None:
            if record is not None and call is not None:
                record.call_failed(call, outcome.failed_because or "")
            return outcome
        try:
            message = convert.run_tool_output_to_proto(outcome.result)
        except Exception:  # left to the RPC, which answers it as it always did
            message, size = None, 0
        else:
            size = message.ByteSize()
        if record is not None and call is not None:
            record.call_returned(call, outcome.result, size)
        return CallOutcome(outcome.result, outcome.failure, message, size)

    async def _run(self, host: EpisodeHost, name: str, tool_input: dict[str, Any]) -> CallOutcome:
        """Takes the call's turn (per-tool lock, the gate) and runs it."""
        try:
            marks = host.tool_marks(name)
        except Exception as exc:  # the constructor of a toolset the environment declares raised
            message = self._redact(f"{type(exc).__name__}: {exc}")
            logger.warning("toolset_instantiation_failed tool=%s error=%s", name, message)
            return CallOutcome(failure=message)
        if isinstance(marks, RunToolOutput):  # not_found, name_collision: counted as refused
            return await self._timed(host, name, _at_once(CallOutcome(result=marks)), live_view=False)
        if self.finished:
            return _refused_as_finished(name)
        if marks.exclusive:
            if self._gate is None:  # a tool the class scan did not see (set on the instance)
                self._gate = ExclusiveGate()
            async with self._gate.exclusive():
                return await self._run_in_turn(host, name, tool_input)
        gate = self._gate
        if marks.concurrent:
            if gate is None:
                return await self._run_in_turn(host, name, tool_input)
            async with gate.shared():
                return await self._run_in_turn(host, name, tool_input)
        # The tool lock outside the gate: calls queued on a tool do not hold an exclusive one off.
        lock = self._tool_locks.get(name)
        if lock is None:
            lock = self._tool_locks[name] = asyncio.Lock()
        async with lock:
            if gate is None:
                return await self._run_in_turn(host, name, tool_input)
            async with gate.shared():
                return await self._run_in_turn(host, name, tool_input)

    def _run_in_turn(self, host: EpisodeHost, name: str, tool_input: dict[str, Any]) -> Awaitable[CallOutcome]:
        """The call, once it has its turn (to await: no coroutine of its own)."""
        # Checked again: a call queued behind a finishing one must not run.
        if self.finished:
            return _at_once(_refused_as_finished(name))
        return self._timed(host, name, self._run_tool(host, name, tool_input))

    async def _timed(
        self, host: EpisodeHost, name: str, call: Awaitable[CallOutcome], live_view: bool = True
    ) -> CallOutcome:
        """Awaits a call, counted in flight and then by duration and outcome in
        the metrics and (`live_view`) the live view's counters, traced when
        tracing is on: one coroutine for all of them."""
        series = metrics.tool_call_series(host.env_cls, name)
        if tracing.tracer is not None:
            call = tracing.traced_tool_call(host, series.tool, call)
        counters = self._counters if live_view else None
        counted = counters.call_started() if counters is not None else 0.0
        started = series.start()
        try:
            outcome = await call
        except BaseException:
            series.end(started, "cancelled")
            if counters is not None:
                counters.call_stopped()
            raise
        series.end(started, metrics.call_outcome(outcome))
        if counters is not None:
            counters.call_ended(name, counted, outcome.failed_because)
        return outcome

    async def _run_tool(self, host: EpisodeHost, name: str, tool_input: dict[str, Any]) -> CallOutcome:
        started = time.monotonic()
        call = host.run_tool(name, tool_input)
        try:
            # Without a timeout, no wait_for: one coroutine less on every call.
            result = await (call if self._timeout_s is None else asyncio.wait_for(call, self._timeout_s))
        except asyncio.TimeoutError:
            logger.warning("tool_timed_out tool=%s timeout_s=%s", name, self._timeout_s)
            return CallOutcome(failure=f"tool call timed out after {self._timeout_s:g}s")
        except Exception as exc:
            crashed = _crashed(exc)
            if crashed is not None:
                return CallOutcome(error=crashed)
            # The message reaches clients and logs: mask the session's secrets.
            message = self._redact(str(exc) or type(exc).__name__)
            logger.warning("tool_failed tool=%s error_type=%s error=%s", name, type(exc).__name__, message)
            return CallOutcome(failure=bounded_text(message))  # the whole text is in the log line above
        if result.root.ok and self.finished:
            # Another call finished the episode while this one ran: the first finished result wins.
            return _refused_as_finished(name)
        if result.root.ok and result.root.output.finished:
            self.finished = True
        logger.debug("tool_completed tool=%s ok=%s duration_ms=%.1f",
                     name, result.root.ok, (time.monotonic() - started) * 1000)
        return CallOutcome(result=result)

    async def _score(self, host: EpisodeHost, candidates: Sequence[GroupCandidate]) -> CallOutcome:
        """One score per candidate (bare numbers become `GroupScore(reward=)`),
        or the failure: the environment raised, or miscounted."""
        try:
            returned = await host.score_group(candidates)
            scores = [score if isinstance(score, GroupScore) else GroupScore(reward=float(score))
                      for score in returned]
            if len(scores) != len(candidates):
                raise ValueError(f"score_group returned {len(scores)} scores for {len(candidates)} candidates")
        except Exception as exc:
            crashed = _crashed(exc)
            if crashed is not None:
                return CallOutcome(error=crashed)
            message = self._redact(str(exc) or type(exc).__name__)
            logger.warning("score_group_failed error_type=%s error=%s", type(exc).__name__, message)
            return CallOutcome(failure=bounded_text(message))
        return CallOutcome(result=scores)
