"""An episode seen from the client: created on enter, kept alive, deleted on exit."""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, ClassVar, Mapping, Optional, Sequence, TypeVar, Union

import grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc.authoring.types import GroupCandidate, GroupScore, Message, TerminalToolSpec, ToolOutput, ToolSpec
from ors_grpc.client import _convert
from ors_grpc.client._connection import Connection
from ors_grpc.client._episode_stream import EpisodeStream
from ors_grpc.client._message_formats import format_messages
from ors_grpc.client._tool_formats import Provider, format_tools
from ors_grpc.client.errors import ORSServerError, ScoreGroupFailedError, ToolCallError, ToolFailedError
from ors_grpc.client.types import EpisodeRecord
from ors_grpc.protocol.random_ids import uuid4_hex, uuid4_text

T = TypeVar("T")

__all__ = ["AsyncSession"]

logger = logging.getLogger("ors_grpc.client")

#: The reference clients ping every 10 s; sessions expire after 15 min without activity.
DEFAULT_PING_INTERVAL_S = 10.0
#: How often a call whose stream broke after its task id arrived is reattached.
DEFAULT_REATTACH_ATTEMPTS = 5
_REATTACH_BASE_DELAY_S = 0.1
_REATTACH_MAX_DELAY_S = 2.0
#: How long each reattach waits for a lost connection to come back.
_RECONNECT_TIMEOUT_S = 10.0
#: Bounds each cleanup RPC, so exiting a session never hangs on a dead server.
_CLEANUP_TIMEOUT_S = 10.0

#: Codes meaning the stream broke (server gone, connection reset, stream
#: cancelled or reset by the server), not that the call failed: the tool runs
#: on regardless, so the call can be reattached by task id.
_STREAM_BROKEN = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL}
#: A reattach found no call with the task id: the call never reached the server.
_UNKNOWN_TASK_ID = "ERROR_REASON_UNKNOWN_TASK_ID"
#: Creating an episode on a RunEpisode stream that broke or was refused
#: before answering (a server shedding a burst of new calls) is tried this
#: many more times, each on a new stream after a short pause. Safe: the
#: maybe-created episode is deleted first, and the next try has a new id.
_CREATE_RETRIES = 4
_CREATE_RETRY_DELAY_S = 0.05
#: A creation refused by a draining server (nothing was created) is made
#: again under a new session id, backing off, for up to DRAINING_PATIENCE_S.
#: Behind a load balancer hashing `x-session-id` every new id is a new draw
#: of the backends, so a count of tries would lose one creation in 2**tries
#: while one of two backends drains; some 30 draws in 30 s make that
#: negligible, and a lone server being replaced is waited for.
_DRAINING = "ERROR_REASON_DRAINING"
_DRAINING_BASE_DELAY_S = 0.05
_DRAINING_MAX_DELAY_S = 1.0
#: How long a creation keeps being made again while it reaches draining servers.
DRAINING_PATIENCE_S = 30.0
#: The session is gone server-side (or its environment's process died with its
#: state): pinging it again is pointless.
_SESSION_GONE = {"ERROR_REASON_SESSION_NOT_FOUND", "ERROR_REASON_SESSION_DELETED", "ERROR_REASON_ENVIRONMENT_CRASHED"}
#: A call waited the server's bound for setup; nothing ran, so it is asked again.
_STARTING = "ERROR_REASON_ENVIRONMENT_STARTING"
#: How long a session call keeps asking again while the environment starts.
STARTUP_PATIENCE_S = 600.0
_STARTING_RETRY_S = 2.0


def _broke_or_refused(error: grpc.aio.AioRpcError) -> bool:
    """The stream broke, or the server refused the call without an ORS reason
    (grpc's own RESOURCE_EXHAUSTED), so another stream may well succeed."""
    if error.code() in _STREAM_BROKEN:
        return True
    return (error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            and ORSServerError.from_rpc_error(error).reason == "ERROR_REASON_UNSPECIFIED")


class AsyncSession:
    """`async with env.session(...) as session:` runs one episode.

    Entering mints a session id and creates the episode; while inside, a
    background task pings every `ping_interval_s`; exiting (also when the body
    raised or was cancelled) deletes the episode and releases the session id.

    With `stream_episode` (the default) the episode's steps go over one
    RunEpisode stream, a few times cheaper than an RPC per step; a step made
    while another is in flight, and every step after the stream broke, uses
    the per-step RPCs instead. Servers without RunEpisode get per-step RPCs.
    """

    def __init__(
        self,
        connection: Connection,
        env_name: str,
        create_request: pb.CreateEpisodeRequest,
        *,
        ping_interval_s: float = DEFAULT_PING_INTERVAL_S,
        reattach_attempts: int = DEFAULT_REATTACH_ATTEMPTS,
        stream_episode: bool = True,
        session_id: Optional[str] = None,
    ) -> None:
        self.env_name = env_name
        self.session_id: Optional[str] = None
        #: The caller's id for the first creation (a prepared episode reserved
        #: for it, say); a retry creates under a new id.
        self._requested_id = session_id
        #: The episode's id once it was deleted (its record lingers a while).
        self._ended_session_id: Optional[str] = None
        self._connection = connection
        self._create_request = create_request
        self._ping_interval_s = ping_interval_s
        self._reattach_attempts = reattach_attempts
        #: The timer that starts pinging once the session has lived a ping interval, then the pinging task.
        self._ping_timer: Optional[asyncio.TimerHandle] = None
        self._pinger: Optional[asyncio.Task[None]] = None
        self._stream_episode = stream_episode
        self._stream: Optional[EpisodeStream] = None
        #: The `x-session-id` of the session's calls: its own id, or, for a
        #: session on a reused stream, the id that stream was opened (and
        #: routed to its backend) with.
        self._route_key: Optional[str] = None
        #: The episode's last tool listing: its terminal tool and score-group
        #: support do not change during an episode.
        self._listing: Optional[pb.ListTaskToolsResponse] = None

    async def __aenter__(self) -> "AsyncSession":
        await _while_draining(self._create)
        self._connection.open_sessions.add(self)
        # A timer, not a task asleep from the start: most episodes end before their first ping.
        self._ping_timer = asyncio.get_running_loop().call_later(self._ping_interval_s, self._start_pinging)
        return self

    def _start_pinging(self) -> None:
        self._ping_timer = None
        self._pinger = asyncio.get_running_loop().create_task(self._ping_forever(), name=f"ors-ping-{self.session_id}")

    async def _create(self) -> None:
        """Creates the episode under a new session id, on a stream or by RPCs."""
        if not (self._stream_episode and await self._create_on_stream()):
            await self._create_by_rpcs()

    async def _create_on_stream(self) -> bool:
        """Creates the episode on a RunEpisode stream (an idle one of the
        connection, else a new one); False when the server has no RunEpisode
        (an older ors-grpc)."""
        # Minted here, not by the server: a new stream is routed by it (load
        # balancers hash `x-session-id`), and an episode whose creation was
        # cut short can still be deleted. The caller's id gets a stream of
        # its own, routed by it to the backend that may hold its prepared episode.
        requested = self._requested_id
        self._requested_id = None
        self.session_id = self._create_request.session_id = requested or uuid4_text()
        pool = self._connection.episode_streams
        retries = 0
        while True:
            stream = pool.take(self.session_id, reuse=requested is None)
            self._route_key = stream.route_key
            try:
                answer = await stream.ask(pb.RunEpisodeRequest(create=self._create_request))
                break
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self.session_id = self._route_key = None
                    self._requested_id = requested  # for the creation by RPCs
                    return False
                await asyncio.shield(self._release())  # the server may have created it
                if not _broke_or_refused(error) or retries == _CREATE_RETRIES:
                    raise ORSServerError.from_rpc_error(error) from None
                if stream.reused:
                    # An idle stream the server had ended (it restarted, say):
                    # the others likely are too.
                    pool.discard_idle()
                else:
                    await asyncio.sleep(_CREATE_RETRY_DELAY_S * 2**retries)
                retries += 1
                requested = None
                self.session_id = self._create_request.session_id = uuid4_text()
            except BaseException:  # cancelled: the server may have created it already
                await asyncio.shield(self._release())
                raise
        if answer.WhichOneof("step") == "error":
            if answer.error.reason == errors_pb2.ERROR_REASON_DRAINING:
                stream.cancel()  # routed to a server that takes no new episode
            else:
                pool.give_back(stream)  # no episode on it: it can carry the next one
            self.session_id = None  # not created (maybe someone else's: never delete it)
            raise ORSServerError.from_step_error(answer.error)
        self._stream = stream
        self._route_key = stream.route_key  # as the server answered it (`EpisodeStream`)
        return True

    async def _create_by_rpcs(self) -> None:
        requested, self._requested_id = self._requested_id, None
        if requested is None:
            requested = (await self._connection.unary("CreateSessionId", pb.CreateSessionIdRequest())).session_id
        self.session_id = self._route_key = requested
        self._create_request.session_id = self.session_id
        try:
            await self._unary("CreateEpisode", self._create_request)
        except BaseException:
            await asyncio.shield(self._release())
            raise

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Deletes the episode and releases the session id. Idempotent."""
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None
        if self._pinger is not None:
            self._pinger.cancel()
            self._pinger = None
        # Shielded: a cancelled body must still free the server's session.
        await asyncio.shield(self._release())

    async def get_prompt(self) -> list[_convert.Block]:
        response = await self._step("GetPrompt", "get_prompt", pb.GetPromptRequest(session_id=self._live_id()))
        return _convert.blocks(response.blocks)

    async def get_messages(
        self, format: Optional[Provider] = None
    ) -> Union[list[Message], list[dict[str, Any]], dict[str, Any]]:
        """The prompt as a role-tagged conversation (an environment without
        `get_messages` answers its prompt as one user message), optionally in
        a provider's shape ("openai", "openrouter", "anthropic", "google")."""
        response = await self._step("GetMessages", "get_messages", pb.GetMessagesRequest(session_id=self._live_id()))
        return format_messages(_convert.messages(response.messages), format)

    async def list_tools(self, format: Optional[Provider] = None) -> Union[list[ToolSpec], list[dict[str, Any]]]:
        """The episode's tools (shared, then task-specific, then its toolset's;
        the terminal tool apart), optionally in a provider's shape."""
        request = pb.ListTaskToolsRequest(session_id=self._live_id())
        self._listing = response = await self._step("ListTaskTools", "list_task_tools", request)
        return format_tools([_convert.tool_spec(t) for t in response.tools], format)

    async def _tool_listing(self) -> pb.ListTaskToolsResponse:
        if self._listing is None:
            await self.list_tools()
        assert self._listing is not None
        return self._listing

    async def terminal_tool(self) -> Optional[TerminalToolSpec]:
        """The episode's terminal tool, or None (listed once, then remembered)."""
        return _convert.terminal_tool(await self._tool_listing())

    async def is_assistant_message_final(self) -> bool:
        """True when a plain assistant message ends the rollout: send its text
        to `call_terminal_tool`."""
        return (await self.terminal_tool()) is not None

    async def call_terminal_tool(self, message: str = "") -> ToolOutput:
        """Calls the terminal tool with `message` as its one input field (none
        for a terminal tool without input). ToolCallError (reason
        `not_found`) when the episode has no terminal tool."""
        spec = await self.terminal_tool()
        if spec is None:
            raise ToolCallError("<terminal>", f"Environment {self.env_name!r} has no @terminal tool", "not_found")
        return await self.call_tool(spec.name, {} if spec.arg is None else {spec.arg: message})

    async def supports_score_group(self) -> bool:
        """True when the environment implements group scoring."""
        return (await self._tool_listing()).supports_score_group

    async def score_group(self, candidates: Sequence[Union[GroupCandidate, Sequence[Message]]]) -> list[GroupScore]:
        """Scores candidate completions of this episode's task (GroupCandidates,
        or bare message lists): one GroupScore per candidate, in order.

        Raises ScoreGroupFailedError when the environment's scoring raised,
        ORSServerError (reason ERROR_REASON_SCORE_GROUP_UNSUPPORTED) when it
        does not implement it. A broken stream is reattached by task id, as
        for tool calls.
        """
        scoring = _PendingScoring([_convert.group_candidate(c) for c in candidates])
        session_id = self._live_id()
        return await self._reattaching(
            "score_group", scoring,
            lambda stream: _score_on_episode_stream(stream, scoring),
            lambda: self._stream_scoring(scoring, session_id),
        )

    async def _stream_scoring(self, scoring: "_PendingScoring", session_id: str) -> list[GroupScore]:
        """One ScoreGroup stream: a new scoring under its idempotency key (run
        once, however often sent), or a reattach once `scoring.task_id` is known."""
        request = pb.ScoreGroupRequest(session_id=session_id, candidates=scoring.candidates,
                                       task_id=scoring.task_id or "")
        if scoring.task_id is None:
            request.idempotency_key = scoring.key
        stream = self._connection.score_group_stream(request, self._route_key)
        try:
            async for event in stream:
                kind = event.WhichOneof("event")
                if kind == "task_id":
                    self._got_task_id(scoring, event.task_id)
                elif kind == "result":
                    return _convert.group_scores(event.result)
                elif kind == "failure":
                    raise ScoreGroupFailedError(event.failure.message)
        finally:
            stream.cancel()
        raise ORSServerError(grpc.StatusCode.INTERNAL, "ERROR_REASON_UNSPECIFIED", "ScoreGroup stream ended without a result")

    async def _step(self, method: str, step: str, request: Any) -> Any:
        """One answer to `request` (asked again while the environment starts)."""
        deadline = _starting_deadline()
        while True:
            try:
                return await self._step_once(method, step, request)
            except ORSServerError as error:
                if not _still_starting(error, deadline):
                    raise
            await _pause_while_starting()

    async def _step_once(self, method: str, step: str, request: Any) -> Any:
        """One answer to `request`: on the episode stream when it is free, else by RPC `method`."""
        stream = self._free_stream()
        if stream is None:
            return await self._unary(method, request)
        try:
            answer = await stream.ask(pb.RunEpisodeRequest(**{step: request}))
        except grpc.aio.AioRpcError as error:
            raise ORSServerError.from_rpc_error(error) from None
        if answer.WhichOneof("step") == "error":
            raise ORSServerError.from_step_error(answer.error)
        return getattr(answer, step)

    def _free_stream(self) -> Optional[EpisodeStream]:
        return self._stream if self._stream is not None and self._stream.free else None

    async def call_tool(self, name: str, input: Optional[Mapping[str, Any]] = None) -> ToolOutput:
        """Runs a tool and returns its output.

        Raises ToolCallError when the server refused the call (unknown tool,
        bad input, episode finished), ToolFailedError when the tool raised,
        ORSServerError when the RPC failed. A stream that breaks once the
        call's task id is known is reattached (never re-run) with backoff.
        """
        call = _PendingCall(name, _checked_input(input))
        session_id = self._live_id()
        return await self._reattaching(
            f"call of {name}", call,
            lambda stream: _call_on_episode_stream(stream, call),
            lambda: self._stream_call(call, session_id),
        )

    async def _reattaching(
        self, what: str, pending: "_PendingCall | _PendingScoring",
        on_episode_stream: Callable[[EpisodeStream], Awaitable[T]], by_rpc: Callable[[], Awaitable[T]],
    ) -> T:
        """Runs work that has a task id (a tool call, a scoring): on the free
        episode stream, else by its streaming RPC; a stream that breaks once
        `pending.task_id` is known is reattached (never re-run) with backoff.
        Asked again while the environment starts (the work never began).
        (One coroutine, both loops: one coroutine less on every call.)"""
        deadline = _starting_deadline()
        while True:
            pending.task_id = None  # an id from an attempt that never started names nothing
            first_break: Optional[grpc.aio.AioRpcError] = None
            try:
                for attempt in range(self._reattach_attempts + 1):
                    try:
                        stream = self._free_stream() if attempt == 0 else None
                        if stream is not None:
                            return await on_episode_stream(stream)
                        return await by_rpc()
                    except grpc.aio.AioRpcError as error:
                        failure = ORSServerError.from_rpc_error(error)
                        if first_break is not None and failure.reason == _UNKNOWN_TASK_ID:
                            raise _never_started(first_break) from None
                        # Before the task id is known we cannot know whether the work
                        # started, and running it twice is worse than failing; unless
                        # the server honours this RPC's idempotency key (sent again).
                        resumable = pending.task_id is not None or pending.RPC in self._connection.rpcs_honouring_keys
                        if not resumable or error.code() not in _STREAM_BROKEN or attempt == self._reattach_attempts:
                            raise failure from None
                        first_break = first_break or error
                        logger.info("%s broke (%s); reattaching by task id", what, error.code().name)
                        await asyncio.sleep(min(_REATTACH_BASE_DELAY_S * 2**attempt, _REATTACH_MAX_DELAY_S))
                        await self._connection.wait_ready(_RECONNECT_TIMEOUT_S)
                raise AssertionError("unreachable")
            except ORSServerError as error:
                if not _still_starting(error, deadline):
                    raise
            await _pause_while_starting()

    async def _stream_call(self, call: "_PendingCall", session_id: str) -> ToolOutput:
        """One CallTool stream: a new call under its idempotency key (run
        once, however often sent), or a reattach once `call.task_id` is known."""
        request = pb.CallToolRequest(session_id=session_id, call=_convert.tool_call(call.name, call.input, call.task_id))
        if call.task_id is None:
            request.idempotency_key = call.key
        stream = self._connection.call_tool_stream(request, self._route_key)
        try:
            async for event in stream:
                kind = event.WhichOneof("event")
                if kind == "task_id":
                    self._got_task_id(call, event.task_id)
                elif kind == "result":
                    return _tool_result(call.name, event.result)
                elif kind == "failure":
                    raise ToolFailedError(call.name, event.failure.message)
        finally:
            stream.cancel()  # a no-op once the stream has ended
        raise ORSServerError(grpc.StatusCode.INTERNAL, "ERROR_REASON_UNSPECIFIED", "CallTool stream ended without a result")

    def _got_task_id(self, pending: "_PendingCall | _PendingScoring", task_id: str) -> None:
        """Keeps the task id (to reattach); one equal to the key sent shows
        that the server honours this RPC's keys."""
        pending.task_id = task_id
        if task_id == pending.key:
            self._connection.rpcs_honouring_keys.add(pending.RPC)

    async def ping(self) -> None:
        await self._unary("Ping", pb.PingRequest(session_id=self._live_id()))

    async def episode_record(self) -> EpisodeRecord:
        """What happened in this episode: its task, every tool call, totals. Also
        after the session closed, while the server keeps the record (60 s by default)."""
        session_id = self.session_id or self._ended_session_id
        if session_id is None:
            raise RuntimeError("the session was never opened: use it as a context manager")
        response = await self._unary("GetEpisodeRecord", pb.GetEpisodeRecordRequest(session_id=session_id))
        return _convert.episode_record(response.record)

    def _live_id(self) -> str:
        if self.session_id is None:
            raise RuntimeError("the session is not open: use it as a context manager")
        return self.session_id

    async def _unary(self, method: str, request: Any) -> Any:
        return await self._connection.unary(method, request, route_key=self._route_key)

    async def _ping_forever(self) -> None:
        """Pings now, then every `ping_interval_s`."""
        while True:
            try:
                await self.ping()
            except ORSServerError as error:
                if error.reason in _SESSION_GONE:
                    logger.warning("session %s is gone (%s); stopped pinging", self.session_id, error.reason)
                    return
                # Transient (server restarting, network blip): the next ping may get through.
                logger.info("ping of session %s failed: %s", self.session_id, error.code.name)
            except Exception as error:  # e.g. the client was closed under the session
                logger.warning("stopped pinging session %s: %r", self.session_id, error)
                return
            await asyncio.sleep(self._ping_interval_s)

    async def _release(self) -> None:
        """A `delete` step on the episode stream, else DeleteEpisode then
        DeleteSessionId; each bounded and best effort."""
        session_id, self.session_id = self.session_id, None
        self._ended_session_id = session_id
        stream, self._stream = self._stream, None
        self._connection.open_sessions.discard(self)
        if session_id is None:
            return
        if stream is not None and await stream.delete_episode(_CLEANUP_TIMEOUT_S):
            self._connection.episode_streams.give_back(stream)
            return
        steps = [("DeleteEpisode", pb.DeleteEpisodeRequest(session_id=session_id))]
        if self._route_key in (None, session_id):
            # Only an id minted by CreateSessionId is released. An episode made on
            # a stream is reached by the stream's key only while it exists.
            steps.append(("DeleteSessionId", pb.DeleteSessionIdRequest(session_id=session_id)))
        for method, request in steps:
            try:
                await self._connection.unary(method, request, route_key=self._route_key, timeout=_CLEANUP_TIMEOUT_S)
            except Exception as error:  # never mask the body's own exception
                logger.warning("%s of session %s failed: %s", method, session_id, error)


async def _while_draining(create: Callable[[], Awaitable[None]]) -> None:
    """`create()`, again (each time under a new session id, which a load
    balancer hashing `x-session-id` sends elsewhere) while the server it
    reached is draining: nothing was created. Backing off, for up to
    DRAINING_PATIENCE_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAINING_PATIENCE_S
    for retry in itertools.count():
        delay = min(_DRAINING_BASE_DELAY_S * 2**retry, _DRAINING_MAX_DELAY_S)
        try:
            return await create()
        except ORSServerError as error:
            if error.reason != _DRAINING or loop.time() + delay > deadline:
                raise
        logger.info("the server is draining; creating the episode again in %gs under a new session id", delay)
        await asyncio.sleep(delay)


# A session call is asked again every few seconds while it fails with ENVIRONMENT_STARTING (the
# environment's setup outlasted the server's wait), for up to STARTUP_PATIENCE_S, as openreward's
# clients ride out its 503. (A loop in each caller, not a function around the call: one coroutine
# less on every call.)

def _starting_deadline() -> float:
    return asyncio.get_running_loop().time() + STARTUP_PATIENCE_S


def _still_starting(error: ORSServerError, deadline: float) -> bool:
    """Whether `error` is ENVIRONMENT_STARTING and there is time to ask again before `deadline`."""
    return error.reason == _STARTING and asyncio.get_running_loop().time() + _STARTING_RETRY_S <= deadline


async def _pause_while_starting() -> None:
    logger.info("environment still starting; asking again in %gs", _STARTING_RETRY_S)
    await asyncio.sleep(_STARTING_RETRY_S)


class _Keyed:
    """Work sent by its RPC under an idempotency key until its task id is known."""

    _key: Optional[str] = None

    @property
    def key(self) -> str:
        """Made on first use: work asked on an episode stream (the common case) never needs one."""
        if self._key is None:
            self._key = uuid4_hex()
        return self._key


@dataclass
class _PendingCall(_Keyed):
    """A tool call being made; `task_id` is set once the server sent it."""

    #: Its RPC, as named in `Connection.rpcs_honouring_keys`.
    RPC: ClassVar[str] = "CallTool"

    name: str
    input: dict[str, Any]
    task_id: Optional[str] = None


@dataclass
class _PendingScoring(_Keyed):
    """A group scoring being made; `task_id` is set once the server sent it."""

    #: Its RPC, as named in `Connection.rpcs_honouring_keys`.
    RPC: ClassVar[str] = "ScoreGroup"

    candidates: list[Any]
    task_id: Optional[str] = None


def _checked_input(tool_input: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    if tool_input is None:
        return {}
    if not isinstance(tool_input, Mapping):
        raise TypeError(f"tool input must be a mapping, got {type(tool_input).__name__}")
    bad_keys = [k for k in tool_input if not isinstance(k, str)]
    if bad_keys:
        raise TypeError(f"tool input keys must be strings, got {bad_keys!r}")
    return dict(tool_input)


async def _call_on_episode_stream(stream: EpisodeStream, call: _PendingCall) -> ToolOutput:
    """A call_tool step under a task id chosen here (kept in `call`, to reattach); its outcome."""
    call.task_id = uuid4_hex()
    answer = await stream.ask(_convert.tool_call_step_request(call.name, call.input, call.task_id))
    if answer.WhichOneof("step") == "error":
        raise ORSServerError.from_step_error(answer.error)
    event = answer.call_tool
    if event.WhichOneof("event") == "failure":
        raise ToolFailedError(call.name, event.failure.message)
    return _tool_result(call.name, event.result)


async def _score_on_episode_stream(stream: EpisodeStream, scoring: _PendingScoring) -> list[GroupScore]:
    """A score_group step under a task id chosen here (kept in `scoring`, to reattach); its outcome."""
    scoring.task_id = uuid4_hex()
    step = pb.ScoreGroupStep(candidates=scoring.candidates, task_id=scoring.task_id)
    answer = await stream.ask(pb.RunEpisodeRequest(score_group=step))
    if answer.WhichOneof("step") == "error":
        raise ORSServerError.from_step_error(answer.error)
    event = answer.score_group
    if event.WhichOneof("event") == "failure":
        raise ScoreGroupFailedError(event.failure.message)
    return _convert.group_scores(event.result)


def _never_started(stream_break: grpc.aio.AioRpcError) -> ORSServerError:
    return ORSServerError(
        stream_break.code(), "ERROR_REASON_UNSPECIFIED",
        f"the stream broke before the call reached the server; the tool did not run ({stream_break.details()})",
    )


def _tool_result(name: str, result: Any) -> ToolOutput:
    if result.WhichOneof("outcome") == "error":
        raise ToolCallError(name, result.error, _convert.refusal_reason(result))
    return _convert.tool_output(result.output)
