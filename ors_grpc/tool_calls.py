"""Tool calls of one session, run as tasks that outlive the RPC that started them.

A call gets a task id (uuid4 hex) at once; the tool then runs in its own
asyncio task, so a client that drops its stream cancels only its watching,
never the tool, and can attach again by task id. A finished call's outcome
stays attachable for `linger_s`. Task ids belong to their session: the
registry is per session, so another session cannot find them. The episode
invariants live here too: once a tool returned `finished=True` further calls
are refused, and calls to the same tool run one at a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from . import metrics
from ._generated.ors.v1 import errors_pb2
from .environment import Environment
from .errors import ORSError
from .types import RunToolError, RunToolOutput

__all__ = ["CallOutcome", "SessionToolCalls", "ToolCallTask", "call_fingerprint"]

logger = logging.getLogger("ors_grpc.tool_calls")

EPISODE_FINISHED = "episode finished"
# Seconds `release` waits for cancelled tool calls to end.
RELEASE_WAIT_S = 10.0
#: Longest task id a client may choose (RunEpisode's call_tool steps).
MAX_TASK_ID_LENGTH = 128


@dataclass(frozen=True)
class CallOutcome:
    """A call's end: the tool's result (or tool-level error), or the message
    of the exception it raised."""

    result: RunToolOutput | None = None
    failure: str | None = None


def call_fingerprint(kind: str, name: str, tool_input: Any) -> str:
    """What an idempotency key is bound to: the kind of call (`tool`, say),
    its name and its input as canonical JSON (keys sorted), hashed."""
    text = json.dumps([kind, name, tool_input], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class ToolCallTask:
    """One tool call, running or finished."""

    #: The call's `call_fingerprint` when it was started under an idempotency key.
    fingerprint: str | None = None

    def __init__(self, task_id: str, task: asyncio.Task[CallOutcome]) -> None:
        self.task_id = task_id
        self._task = task

    @property
    def done(self) -> bool:
        return self._task.done()

    async def outcome(self) -> CallOutcome:
        """Wait for the outcome. Cancelling this wait leaves the tool running."""
        await asyncio.wait({self._task})
        if self._task.cancelled():  # only `release` cancels: the session ended
            raise ORSError(errors_pb2.ERROR_REASON_SESSION_DELETED, "Session deleted")
        return self._task.result()

    def cancel(self) -> asyncio.Task[CallOutcome]:
        """Cancel the tool's task; returns it, to wait for its end."""
        self._task.cancel()
        return self._task


class SessionToolCalls:
    """The tool calls of one session: start, attach, release."""

    def __init__(
        self, *, linger_s: float, timeout_s: float | None, sync_lock: asyncio.Lock, redact: Any = str
    ) -> None:
        self._linger_s = linger_s
        self._sync_lock = sync_lock
        self._timeout_s = timeout_s
        self._redact = redact
        self._calls: dict[str, ToolCallTask] = {}
        self._evictions: dict[str, asyncio.TimerHandle] = {}
        self._tool_locks: dict[str, asyncio.Lock] = {}
        self.finished = False
        #: monotonic time the last call completed (counts as session activity).
        self.last_completed = 0.0

    @property
    def in_flight(self) -> bool:
        return any(not call.done for call in self._calls.values())

    def start(
        self, env: Environment, name: str, tool_input: dict[str, Any], *, task_id: str | None = None
    ) -> ToolCallTask:
        """Runs a call under `task_id` (the client's choice), else a new one."""
        if task_id is None:
            task_id = uuid.uuid4().hex
        elif not 0 < len(task_id) <= MAX_TASK_ID_LENGTH:
            raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST,
                           f"task_id must be 1 to {MAX_TASK_ID_LENGTH} characters")
        elif task_id in self._calls:
            raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST, "task_id is already in use in this session")
        task = asyncio.get_running_loop().create_task(
            self._run(env, name, tool_input), name=f"ors-tool-{name}-{task_id}"
        )
        call = ToolCallTask(task_id, task)
        self._calls[task_id] = call
        task.add_done_callback(lambda _: self._on_done(task_id))
        return call

    def run_once(self, key: str, fingerprint: str, start: Callable[[str], ToolCallTask]) -> ToolCallTask:
        """The call of idempotency key `key`: the one already started under
        it (same fingerprint, else IDEMPOTENCY_KEY_REUSED), else a new one,
        `start(key)`, with `key` as its task id. Shared by every kind of call
        that takes a key (CallTool; any other call started through `start`)."""
        call = self._calls.get(key)
        if call is None:
            call = start(key)
            call.fingerprint = fingerprint
        elif call.fingerprint != fingerprint:
            raise ORSError(errors_pb2.ERROR_REASON_IDEMPOTENCY_KEY_REUSED,
                           "this idempotency key was already used for a call with another tool or input")
        return call

    def attach(self, task_id: str) -> ToolCallTask:
        call = self._calls.get(task_id)
        if call is None:
            raise ORSError(errors_pb2.ERROR_REASON_UNKNOWN_TASK_ID, "unknown task_id")
        return call

    async def release(self) -> None:
        """Cancel running calls and forget every call (the session ended)."""
        for handle in self._evictions.values():
            handle.cancel()
        self._evictions.clear()
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
            loop = asyncio.get_running_loop()
            self._evictions[task_id] = loop.call_later(self._linger_s, self._evict, task_id)

    def _evict(self, task_id: str) -> None:
        self._evictions.pop(task_id, None)
        self._calls.pop(task_id, None)

    async def _run(self, env: Environment, name: str, tool_input: dict[str, Any]) -> CallOutcome:
        if self.finished:
            return CallOutcome(result=RunToolOutput(RunToolError(error=EPISODE_FINISHED)))
        lock = self._tool_locks.setdefault(name, asyncio.Lock())
        async with lock:
            # Checked again: a call queued behind a finishing one must not run.
            if self.finished:
                return CallOutcome(result=RunToolOutput(RunToolError(error=EPISODE_FINISHED)))
            return await metrics.timed_tool_call(env, name, self._run_tool(env, name, tool_input))

    async def _run_tool(self, env: Environment, name: str, tool_input: dict[str, Any]) -> CallOutcome:
        started = time.monotonic()
        try:
            result = await asyncio.wait_for(env._call_tool(name, tool_input, sync_lock=self._sync_lock), self._timeout_s)
        except asyncio.TimeoutError:
            logger.warning("tool_timed_out tool=%s timeout_s=%s", name, self._timeout_s)
            return CallOutcome(failure=f"tool call timed out after {self._timeout_s:g}s")
        except Exception as exc:
            # The message reaches clients and logs: mask the session's secrets.
            message = self._redact(str(exc) or type(exc).__name__)
            logger.warning("tool_failed tool=%s error_type=%s error=%s", name, type(exc).__name__, message)
            return CallOutcome(failure=message)
        if result.root.ok and result.root.output.finished:
            self.finished = True
        logger.debug("tool_completed tool=%s ok=%s duration_ms=%.1f",
                     name, result.root.ok, (time.monotonic() - started) * 1000)
        return CallOutcome(result=result)
