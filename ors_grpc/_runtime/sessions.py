"""The session table: episodes by session id, their background setup, the reaper.

Creating an episode answers once the environment is constructed (its
session toolset, if one was named, attached), as openreward's `/create`
does: a constructor that raises (a task spec it rejects) fails the creation
and leaves no session. `setup()` runs on in a background task, and
session-scoped calls wait for it (`ready`), for at most `setup_wait_s`: then
they fail with ENVIRONMENT_STARTING, to be retried.
Sessions idle for `session_timeout_s` are reaped (teardown included) unless a
tool call is in flight. Deleting cancels a running setup, releases the tool
calls and runs `teardown()`.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import time
import uuid
from typing import Any, Iterable, Sequence

from ors_grpc.observability import metrics
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc.authoring.environment import Environment, class_has_exclusive_tools
from ors_grpc._runtime.environment_host import EpisodeState, HostFactory
from ors_grpc._runtime.episode_record import EndedRecords, EpisodeRecorder
from ors_grpc._runtime.exclusive_gate import ExclusiveGate
from ors_grpc._runtime.issued_ids import IssuedIds
from ors_grpc._runtime.local_hosts import LocalHosts
from ors_grpc.protocol.errors import ORSError, bounded_text, session_not_found
from ors_grpc._runtime.server_stats import ServerStats
from ors_grpc._runtime.session import Session
from ors_grpc._runtime.tool_calls import SessionToolCalls
from ors_grpc._runtime.warm_pool import WarmPool
from ors_grpc.protocol.constants import DEFAULT_SETUP_WAIT_S, DEFAULT_WARM_SETUP_TIMEOUT_S, DEFAULT_WARM_TTL_S

__all__ = ["Session", "SessionTable", "redactor"]

logger = logging.getLogger("ors_grpc.sessions")

# Seconds deletion waits for a synchronous setup (which cannot be interrupted)
# to end before giving up on tearing its environment down.
SETUP_STOP_WAIT_S = 30.0
ENVIRONMENT_STARTING_MESSAGE = "Environment still starting."
DRAINING_MESSAGE = "The server is draining: create the episode under a new session id, on another server."


def _no_secrets(text: str) -> str:
    return text


def redactor(secret_values: Iterable[str]):
    """A function that masks the given secret values in a text (for logs)."""
    values = sorted((v for v in secret_values if v), key=len, reverse=True)
    if not values:
        return _no_secrets  # one shared function, not a closure per session

    def redact(text: str) -> str:
        for value in values:
            text = text.replace(value, "***")
        return text

    return redact


def _failure_message(session: Session) -> str:
    """Why the episode's constructor or setup failed ("" when they did not)."""
    failure = session.host.failure
    return failure.message if failure is not None else ""


class SessionTable:
    """Every session of the server, owned by the service."""

    def __init__(
        self,
        *,
        session_timeout_s: float,
        reaper_interval_s: float,
        result_linger_s: float,
        max_sessions: int | None = None,
        tool_timeout_s: float | None = None,
        warm_ttl_s: float = DEFAULT_WARM_TTL_S,
        setup_wait_s: float = DEFAULT_SETUP_WAIT_S,
        warm_setup_timeout_s: float = DEFAULT_WARM_SETUP_TIMEOUT_S,
        hosts: HostFactory | None = None,
    ) -> None:
        #: Where episodes' environments (and classes' own calls) are hosted.
        self.hosts: HostFactory = hosts if hosts is not None else LocalHosts()
        self._setup_wait_s = setup_wait_s
        self._timeout_s = session_timeout_s
        self._reaper_interval_s = reaper_interval_s
        self._linger_s = result_linger_s
        self._max_sessions = max_sessions
        self._tool_timeout_s = tool_timeout_s
        self._sessions: dict[str, Session] = {}
        self._reaper: asyncio.Task[None] | None = None
        #: Episodes prepared ahead (PrepareEpisodes), held outside the table until claimed.
        self.warm = WarmPool(ttl_s=warm_ttl_s, end=self.end, setup_timeout_s=warm_setup_timeout_s)
        #: Per-environment counters for the live view (GetServerStats).
        self.stats = ServerStats()
        #: Set once the server drains: no new episode or session id from then
        #: on (but an episode under an id it issued just before: `issued_ids`).
        self.draining = False
        #: The session ids CreateSessionId handed out, for a while (`issued_ids`).
        self.issued = IssuedIds()
        self._emptied: asyncio.Event | None = None
        #: The records of ended episodes, answered as long as finished results linger.
        self._ended_records = EndedRecords(result_linger_s)

    @property
    def open_count(self) -> int:
        return len(self._sessions)

    def open_by_environment(self) -> collections.Counter[type]:
        """Sessions held now, by environment class."""
        return collections.Counter(session.env_cls for session in self._sessions.values())

    def load(self) -> float:
        """Sessions held (open and warm) over `max_sessions`: how full this backend is; NaN without a limit."""
        if self._max_sessions is None:
            return math.nan
        return (len(self._sessions) + self.warm.count) / self._max_sessions

    def start(self) -> None:
        """Start the reaper (needs a running loop)."""
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever(), name="ors-reaper")

    async def create(
        self, sid: str, env_cls: type[Environment], task_spec: dict[str, Any], secrets: dict[str, str],
        api_key: str = "", toolset_cls: type | None = None, toolset_name: str | None = None,
        *, task_json: str | None = None,
    ) -> Session:
        """Register an episode, start its construction (with its session
        toolset's, `toolset_cls`) and setup, or claim a prepared one of the
        same task, secrets and `api_key`: the one reserved for `sid`, else an
        unreserved one (warm_pool; prepared episodes have no session
        toolset, so a creation with one never claims); and wait for the
        constructors. One that raised fails the creation (the episode is
        unregistered): SETUP_FAILED, or TOOLSET_REFUSED for a toolset's
        ValueError. `task_json`: `task_spec` as the request's JSON text, for the record."""
        self.check_can_create(sid)
        session = None if toolset_cls is not None else self.warm.claim(env_cls, task_spec, secrets, api_key, sid)
        if session is None:
            self._check_room(1)
            session = self._start(sid, env_cls, task_spec, secrets, toolset_cls, toolset_name, task_json)
        session.sid = sid
        self.issued.forget(sid)
        session.record.created_at = time.time()  # a claimed episode's life starts now
        session.touch()
        self._sessions[sid] = session
        metrics.session_opened(env_cls)
        await session.constructed.wait()
        state = session.host.state
        if state is EpisodeState.CONSTRUCTION_FAILED or state is EpisodeState.CRASHED:
            session.host.end()  # nothing to tear down: the host lets go of the episode
            if self._sessions.get(sid) is session:
                del self._sessions[sid]
                metrics.session_closed()
            raise session.host.failure
        if state is EpisodeState.ENDED:  # deleted while constructing
            raise ORSError(errors_pb2.ERROR_REASON_SESSION_DELETED, "Session deleted")
        # DEBUG: a training loop opens hundreds of sessions a second.
        logger.debug("session_created env=%s", env_cls.name().lower())
        return session

    def prepare(
        self, env_cls: type[Environment], task_specs: list[dict[str, Any]], secrets: dict[str, str],
        api_key: str = "", session_ids: Sequence[str] = (),
    ) -> None:
        """Start episodes of `task_specs` ahead, for `create` to claim (all or
        none: they count as sessions); each for the creation under its
        session id only, when `session_ids` (one per task) are given."""
        self._refuse_when_draining()
        taken = [sid for sid in session_ids if sid in self._sessions or self.warm.is_reserved(sid)]
        if taken:
            raise ORSError(errors_pb2.ERROR_REASON_SESSION_EXISTS, f"Session already exists: {taken[0]}")
        self._check_room(len(task_specs))
        for task_spec, reserved_for in itertools.zip_longest(task_specs, session_ids):
            session = self._start(reserved_for or f"warm-{uuid.uuid4()}", env_cls, task_spec, secrets)
            self.warm.hold(session, task_spec, secrets, api_key, reserved_for)

    def _check_room(self, adding: int) -> None:
        if self._max_sessions is not None and len(self._sessions) + self.warm.count + adding > self._max_sessions:
            raise ORSError(errors_pb2.ERROR_REASON_TOO_MANY_SESSIONS, "Too many sessions")

    def _start(
        self, sid: str, env_cls: type[Environment], task_spec: dict[str, Any], secrets: dict[str, str],
        toolset_cls: type | None = None, toolset_name: str | None = None, task_json: str | None = None,
    ) -> Session:
        """A new session whose construction (with its session toolset's,
        `toolset_cls`) and setup run in the background."""
        redact = redactor(secrets.values())
        record = EpisodeRecorder(env_cls.name().lower(), task_spec, toolset_name, redact,
                                 masking=redact is not _no_secrets, task_json=task_json)
        exclusive = class_has_exclusive_tools(env_cls) or (
            toolset_cls is not None and class_has_exclusive_tools(toolset_cls)
        )
        calls = SessionToolCalls(
            linger_s=self._linger_s, timeout_s=self._tool_timeout_s, redact=redact,
            gate=ExclusiveGate() if exclusive else None, counters=self.stats.of(env_cls), record=record,
        )
        session = Session(sid, self.hosts.episode(env_cls), calls=calls, redact=redact, record=record)
        session.setup_task = asyncio.get_running_loop().create_task(
            metrics.timed_setup(session, self._set_up(session, task_spec, secrets, toolset_cls)),
            name=f"ors-setup-{sid}",
        )
        # A finished setup task is not kept (memory per idle session).
        session.setup_task.add_done_callback(lambda _: setattr(session, "setup_task", None))
        return session

    def check_can_create(self, sid: str) -> None:
        """SESSION_EXISTS, TOO_MANY_SESSIONS, or DRAINING unless this server
        issued `sid` moments ago (`issued_ids`: a proxy routes it nowhere else)."""
        if not self.issued.recent(sid):
            self._refuse_when_draining()
        if sid in self._sessions:
            raise ORSError(errors_pb2.ERROR_REASON_SESSION_EXISTS, "Session already exists")
        if self._max_sessions is not None and len(self._sessions) >= self._max_sessions:
            raise ORSError(errors_pb2.ERROR_REASON_TOO_MANY_SESSIONS, "Too many sessions")

    def issue_id(self) -> str:
        """A new session id, remembered (`issued`); DRAINING once the server
        drains: its client asks again, and a proxy sends it to another server."""
        self._refuse_when_draining()
        return self.issued.new()

    def _refuse_when_draining(self) -> None:
        if self.draining:
            raise ORSError(errors_pb2.ERROR_REASON_DRAINING, DRAINING_MESSAGE)

    async def start_draining(self) -> None:
        """Refuse new episodes from now on (DRAINING), and end the prepared
        ones: no creation can claim them any more."""
        self.draining = True
        await self.warm.close()

    async def until_empty(self) -> None:
        """Returns once the table holds no episode (each was deleted or reaped)."""
        while self._sessions:
            self._emptied = asyncio.Event()
            await self._emptied.wait()

    def find(self, sid: str) -> Session | None:
        """The session of `sid` if there is one (not marked active)."""
        return self._sessions.get(sid)

    def get(self, sid: str) -> Session:
        """The session of `sid`, marked active."""
        session = self._sessions.get(sid)
        if session is None:
            raise session_not_found(sid)
        session.touch()
        return session

    async def ready(self, sid: str) -> Session:
        """The session, once set up (its host READY)."""
        session = self.get(sid)
        if session.host.state is not EpisodeState.READY:
            await self._until_ready(session)
        return session

    async def _until_ready(self, session: Session) -> None:
        if not session.ready.is_set():
            try:
                await asyncio.wait_for(session.ready.wait(), self._setup_wait_s)
            except asyncio.TimeoutError:
                raise ORSError(errors_pb2.ERROR_REASON_ENVIRONMENT_STARTING, ENVIRONMENT_STARTING_MESSAGE) from None
        state = session.host.state
        if state is EpisodeState.ENDED:
            raise ORSError(errors_pb2.ERROR_REASON_SESSION_DELETED, "Session deleted")
        if session.host.failure is not None:
            raise session.host.failure
        assert state is EpisodeState.READY, state

    def record(self, sid: str) -> pb.EpisodeRecord:
        """The record of the episode of `sid`: live, or ended within the linger time."""
        session = self._sessions.get(sid)
        if session is not None:
            return session.record.to_proto(sid, setup_error=_failure_message(session))
        record = self._ended_records.find(sid)
        if record is None:
            raise session_not_found(sid)
        return record

    async def delete(self, sid: str, ended: int = pb.EPISODE_END_DELETED) -> None:
        """End the episode of `sid`, if any (`ended`: how, for its record). Idempotent."""
        self.issued.forget(sid)
        session = self._sessions.pop(sid, None)
        if session is None:
            return
        self._ended_records.add(sid, session.record, ended, _failure_message(session))
        if not self._sessions and self._emptied is not None:
            self._emptied.set()
        metrics.session_closed()
        await self.end(session)
        logger.debug("session_deleted")

    async def end(self, session: Session) -> None:
        """Stop a session's setup and calls and tear it down (it is out of the table)."""
        session.host.end()
        session.mark_ready()  # wake waiters: they answer "Session deleted"
        await self._stop_setup(session)
        await session.calls.release()
        await self._tear_down(session)

    async def close(self) -> None:
        """Stop the reaper and end every session."""
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.wait({self._reaper})
            self._reaper = None
        await asyncio.gather(self.warm.close(), *(self.delete(sid, pb.EPISODE_END_SERVER_STOPPED)
                                                  for sid in list(self._sessions)))

    async def _stop_setup(self, session: Session) -> None:
        """Stop a running setup. Async setup is cancelled; synchronous code in
        a thread cannot be, so it is waited for: a sync `setup()` that ends
        well leaves an environment that is then torn down (as the reference
        SDK, whose sync setup runs to its end, would)."""
        task = session.setup_task
        if task is None or task.done():
            return
        if not session.host.uninterruptible:
            task.cancel()
        _, still_running = await asyncio.wait({task}, timeout=SETUP_STOP_WAIT_S)
        if still_running:
            # Its own task tears the environment down if setup ever ends well.
            logger.warning("setup_still_running_after_delete waited_s=%s", SETUP_STOP_WAIT_S)

    async def _set_up(
        self, session: Session, task_spec: dict[str, Any], secrets: dict[str, str], toolset_cls: type | None
    ) -> None:
        started = time.monotonic()
        host = session.host
        try:
            if not await self._construct(session, task_spec, secrets, toolset_cls):
                return  # a constructor failed, or deleted while constructing: nothing to tear down
            session.mark_constructed()
            await host.setup()
        except Exception as exc:
            host.fail(self._setup_failed(session, exc))
        else:
            logger.debug("setup_completed duration_ms=%.1f", (time.monotonic() - started) * 1000)
            if host.state is EpisodeState.ENDED:  # deleted while setting up: nobody else tears it down
                await self._tear_down(session)
        finally:
            session.mark_constructed()
            session.mark_ready()

    async def _construct(
        self, session: Session, task_spec: dict[str, Any], secrets: dict[str, str], toolset_cls: type | None
    ) -> bool:
        """Construct the episode's environment, with its session toolset
        attached: False when a constructor raised (the host's failure says
        why) or the episode was deleted meanwhile."""
        host = session.host
        try:
            await host.construct(task_spec, secrets)
            if host.state is EpisodeState.ENDED:
                return False
            if toolset_cls is not None:
                await self._attach_toolset(session, toolset_cls)
        except Exception as exc:
            host.fail(exc if isinstance(exc, ORSError) else self._setup_failed(session, exc))
            return False
        return True

    async def _attach_toolset(self, session: Session, toolset_cls: type) -> None:
        try:
            await session.host.attach_toolset(toolset_cls)
        except ValueError as exc:
            # openreward answers a toolset's ValueError (it cannot serve this environment) with a 400.
            raise self._failure(session, ORSError(errors_pb2.ERROR_REASON_TOOLSET_REFUSED, session.redact(
                str(exc) or type(exc).__name__))) from None

    def _setup_failed(self, session: Session, exc: Exception) -> ORSError:
        """A constructor or `setup()` raised: SETUP_FAILED, worded as openreward
        words it (`Type: message`), the session's secrets masked (it reaches
        clients and logs)."""
        message = session.redact(f"{type(exc).__name__}: {exc}")
        logger.warning("setup_failed error_type=%s error=%s", type(exc).__name__, message)
        return self._failure(session, ORSError(errors_pb2.ERROR_REASON_SETUP_FAILED, message))

    def _failure(self, session: Session, error: ORSError) -> ORSError:
        """`error`, its message cut once here (every later call answers it), counted in the stats."""
        error = ORSError(error.reason, bounded_text(error.message))
        self.stats.of(session.env_cls).error("setup", error.message)
        return error

    async def _tear_down(self, session: Session) -> None:
        """The environment's `teardown()`, if it was set up (once: the host keeps count)."""
        try:
            await session.host.teardown()
        except Exception as exc:
            logger.warning("teardown_failed error_type=%s error=%s",
                           type(exc).__name__, session.redact(str(exc)))

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self._reaper_interval_s)
            try:
                await self.reap()
            except Exception:  # a bug here must not stop the reaping for good
                logger.exception("reaper_failed")

    async def reap(self) -> None:
        """Delete sessions idle longer than the timeout, unless a call is in flight."""
        now = time.monotonic()
        expired = [
            sid for sid, session in self._sessions.items()
            if session.idle_for(now) > self._timeout_s and not session.calls.in_flight
        ]
        if expired:
            logger.info("sessions_expired count=%d", len(expired))
            metrics.SESSIONS_REAPED.inc(len(expired))
            await asyncio.gather(*(self.delete(sid, pb.EPISODE_END_REAPED) for sid in expired))
