"""The ORS gRPC servicer: every RPC of ors.v1.EnvironmentService.

Handlers speak `ORSError`. What the environment's code raises becomes one
(ENVIRONMENT_ERROR, naming the exception) where it is run (`_environment_code`);
anything else is a bug of ours. `_classified` is the one place that tells the
two apart: `_answering` (around every handler) ends the RPC with its status,
message and `ors-error-reason` trailing metadata entry (see errors.py), and a
failed RunEpisode step answers the same in a `StepError`. One log line per
request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import ipaddress
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence, Union

import grpc

from ors_grpc._version import __version__
from ors_grpc.protocol import convert as _convert
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc.authoring.environment import Environment, find_terminal_tool, flatten_messages, overrides
from ors_grpc._runtime.environment_host import CatalogHost
from ors_grpc._runtime.server_stats import WINDOW_S
from ors_grpc._runtime.session import Session
from ors_grpc._runtime.tool_calls import CallOutcome, ToolCallTask
from ors_grpc.protocol import json_text
from ors_grpc.protocol.errors import (
    ORSError, abort, environment_error, invalid_index, invalid_index_range, invalid_split, logged_bounded_text,
    message_too_large, unknown_environment,
)
from ors_grpc._runtime.drain import Drain
from ors_grpc._runtime.sessions import SessionTable
from ors_grpc._runtime.tool_calls import SCORE_GROUP, call_fingerprint
from ors_grpc._runtime.warm_pool import MAX_PREPARE_PER_REQUEST
from ors_grpc.authoring.types import ListToolsOutput, Message, Split
from ors_grpc.protocol.constants import API_KEY_METADATA_KEY, SESSION_ID_METADATA_KEY
from ors_grpc.protocol.random_ids import uuid4_text
from ors_grpc.protocol.routed_ids import routed_id, session_key

__all__ = ["EnvironmentService", "environment_map", "toolset_map"]

logger = logging.getLogger("ors_grpc.service")

#: What at most two levels of messages around a part add to its size (a
#: field tag and a length each): answers whose parts' sizes are known are
#: measured against the message limit only when those come this close to it.
_WRAPPING_BYTES = 32
#: How a message limit error names a CallTool event, and each RunEpisode step's answer.
_CALL_TOOL_EVENT = "a CallTool message"
_STEP_ANSWERS = {
    step.name: f"the answer to the {step.name} step"
    for step in pb.RunEpisodeRequest.DESCRIPTOR.oneofs_by_name["step"].fields
}

LISTING_UNSUPPORTED_MESSAGE = (
    "list_tasks is not supported for this environment. "
    "Use the index-based API (num_tasks + get_task) instead."
)


def environment_map(environments: Sequence[type[Environment]]) -> dict[str, type[Environment]]:
    """Environments by lower-cased class name, in registration order."""
    env_map: dict[str, type[Environment]] = {}
    for env_cls in environments:
        if not (inspect.isclass(env_cls) and issubclass(env_cls, Environment)):
            raise TypeError(f"{env_cls!r} is not an Environment subclass")
        key = env_cls.name().lower()
        if key in env_map:
            raise ValueError(f"duplicate environment {key!r}")
        listed = env_cls.list_tools()  # also checks the @terminal rules
        if not listed.tools and listed.terminal_tool is None:
            raise ValueError(f"Environment '{key}' has no tools defined. Add at least one @tool method.")
        if not (overrides(env_cls, "get_prompt") or overrides(env_cls, "get_messages")):
            raise ValueError(
                f"Environment '{key}' implements neither get_prompt() nor get_messages(). "
                f"Implement get_prompt() (or get_messages() for a conversation-shaped environment)."
            )
        if not inspect.iscoroutinefunction(env_cls.list_splits) and not env_cls.list_splits():
            raise ValueError(
                f"Environment '{key}' has no splits defined. "
                "Implement list_splits() to return at least one split."
            )
        env_map[key] = env_cls
    if not env_map:
        raise ValueError("at least one environment is required")
    return env_map


def _no_secrets(text: str) -> str:
    return text


@contextlib.contextmanager
def _environment_code(
    redact: Callable[[str], str] = _no_secrets, answered: tuple[type[Exception], ...] = ()
) -> Iterator[None]:
    """Around a run of the environment's code: what it raises is answered as
    ENVIRONMENT_ERROR, `Type: message` with `redact` (the session's secrets
    masked), not as a bug of ours; the `answered` types pass as they are, for
    the caller to answer (an IndexError is INVALID_INDEX)."""
    try:
        yield
    except (ORSError, *answered):
        raise
    except Exception as exc:
        message = redact(f"{type(exc).__name__}: {exc}")
        logger.warning("environment_error error_type=%s error=%s", type(exc).__name__, message)
        # `from None`: the original, unmasked message must not reach the log.
        raise environment_error(message) from None


ToolsetRegistry = Union[Sequence[type], Mapping[str, type]]


def toolset_map(toolsets: ToolsetRegistry) -> dict[str, type]:
    """Toolsets that sessions may attach by name: a mapping of names to
    classes, or classes named by their `name()` (else class name)."""
    if isinstance(toolsets, Mapping):
        named = list(toolsets.items())
    else:
        named = [(_registered_name(cls), cls) for cls in toolsets]
    registry: dict[str, type] = {}
    for name, toolset_cls in named:
        if not inspect.isclass(toolset_cls):
            raise TypeError(f"toolset {name!r}: {toolset_cls!r} is not a class")
        if name in registry:
            raise ValueError(f"duplicate toolset {name!r}")
        find_terminal_tool(toolset_cls)  # its @terminal rules, checked now rather than per session
        registry[name] = toolset_cls
    return registry


def _registered_name(toolset_cls: type) -> str:
    """A toolset's name: its `name()` (Toolset's is the class name), else the class name."""
    name = getattr(toolset_cls, "name", None)
    return name() if callable(name) else toolset_cls.__name__


async def _session_code(session: Session, call: Awaitable[Any]) -> Any:
    """Await one of a session's host calls (prompt, messages, task tools)."""
    with _environment_code(session.redact):
        return await call


def _classified(method: str, exc: Exception) -> ORSError | str:
    """What a failed handler answers: its ORSError, else (a bug of ours,
    logged with its traceback) the message of an INTERNAL status. JSON over
    json_text's rules in an answer is the environment's (ENVIRONMENT_ERROR):
    the service writes only JSON the environment made (requests' JSON is
    checked as it is read, an ORSError JSON_LIMIT)."""
    if isinstance(exc, ORSError):
        return exc
    logger.warning("rpc_error method=%s error_type=%s", method, type(exc).__name__, exc_info=exc)
    if isinstance(exc, json_text.JsonLimitError):
        return environment_error(f"{type(exc).__name__}: {exc}")
    return f"{type(exc).__name__}: {exc}"


def _step_error(step: str, exc: Exception) -> pb.StepError:
    """What a RunEpisode step answers when it fails: the status its RPC would end with."""
    error = _classified(step, exc)
    if isinstance(error, str):
        return pb.StepError(code=grpc.StatusCode.INTERNAL.value[0], message=logged_bounded_text(error, step))
    return pb.StepError(code=error.code.value[0], reason=error.reason, message=logged_bounded_text(error.message, step))


class _answering:
    """Map what a handler raises to a status (ORSError with its reason, bugs
    to INTERNAL), log one line per request, and tell the drain a call
    arrived (`drain.last_call_at`). (A class, not a generator made
    into a context manager: it is entered by every RPC, ten times an episode
    on the HTTP door, for a third of the cost.)"""

    __slots__ = ("_drain", "_method", "_context", "_started")

    def __init__(self, drain: Drain | None, method: str, context: grpc.aio.ServicerContext) -> None:
        self._drain = drain
        self._method = method
        self._context = context

    async def __aenter__(self) -> None:
        self._started = time.monotonic()
        if self._drain is not None:  # the call's arrival: a drain ends once calls stop coming
            self._drain.last_call_at = self._started

    async def __aexit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> bool:
        outcome = "OK"
        try:
            if isinstance(exc, asyncio.CancelledError):
                outcome = "CANCELLED"  # the client went away; a running tool goes on
            elif isinstance(exc, Exception) and not isinstance(exc, grpc.aio.AbortError):
                error = _classified(self._method, exc)
                if isinstance(error, str):
                    outcome = "INTERNAL"
                    await self._context.abort(grpc.StatusCode.INTERNAL, logged_bounded_text(error, self._method))
                outcome = error.reason_name
                await abort(self._context, error)
            return False  # (anything else raised goes on as it is)
        finally:
            logger.debug("rpc method=%s outcome=%s duration_ms=%.1f",
                         self._method, outcome, (time.monotonic() - self._started) * 1000)


#: RPCs a drain does not wait to stop coming (`_answering`): `ors-grpc drain --wait` polls Drain until the
#: server exits.
_NOT_TRAFFIC = frozenset({"Drain"})


def _unary(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A unary handler answering through `_answering`."""

    what = f"the {handler.__name__} answer"
    traffic = handler.__name__ not in _NOT_TRAFFIC

    @functools.wraps(handler)
    async def wrapped(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with _answering(self._drain if traffic else None, handler.__name__, context):
            return self._within_limit(await handler(self, request, context), what)

    return wrapped


def _streaming(handler: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """A server-streaming handler answering through `_answering`."""

    what = f"a {handler.__name__} message"

    @functools.wraps(handler)
    async def wrapped(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async with _answering(self._drain, handler.__name__, context):
            async for message in handler(self, request, context):
                yield self._within_limit(message, what)

    return wrapped


def _session_id(request: Any, context: grpc.aio.ServicerContext) -> str:
    """The request's session id, else the `x-session-id` metadata entry.
    (EnvironmentService._session_id also checks that both agree.)"""
    sid = _key(request.session_id) or _metadata_session_id(context)
    if not sid:
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST, "session_id is required")
    return sid


def _api_key(context: grpc.aio.ServicerContext) -> str:
    """The request's `x-api-key` metadata entry ("" without one): a prepared
    episode is claimed only under the key it was prepared with."""
    for key, value in context.invocation_metadata() or ():
        if key == API_KEY_METADATA_KEY:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return ""


def _metadata_session_id(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == SESSION_ID_METADATA_KEY:
            return _key(value)
    return ""


def _key(sid: str) -> str:
    """The session a session id names: a routed id (`routed_ids`) names its KEY,
    which is all a backend behind Envoy sees of it in `x-session-id`."""
    return session_key(sid.strip())


def _new_session_id() -> str:
    return uuid4_text()


def _stream_session_id(named: str, stream_sid: str | None) -> str:
    """The episode a RunEpisode step acts on: the stream's own (`named`, the
    step's `session_id`, may be empty or must say the same)."""
    if stream_sid is None:
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST, "no episode on this stream: create one first")
    if named and _key(named) not in ("", stream_sid):  # (most steps name none)
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST, "session_id is not this stream's episode")
    return stream_sid


def _ids_to_reserve(request: pb.PrepareEpisodesRequest, count: int, routed: str) -> list[str]:
    """The session ids a PrepareEpisodes request reserves (none, or one per
    episode); with `x-session-id` metadata (`routed`), exactly that one."""
    session_ids = [_key(sid) for sid in request.session_ids]
    if not session_ids:
        return []
    if len(session_ids) != count or not all(session_ids) or len(set(session_ids)) != count:
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST,
                       "session_ids must be one non-empty, distinct id per episode")
    if routed and session_ids != [routed]:
        raise ORSError(errors_pb2.ERROR_REASON_SESSION_ID_MISMATCH,
                       "a request routed by x-session-id must reserve exactly that one session id")
    return session_ids


def _tool_input(tool_call: pb.ToolCallStep | Any) -> tuple[dict[str, Any], str]:
    """A call's input object ({} when unset) and its JSON text as the request
    carried it: the episode record keeps that text rather than writing the
    object out again."""
    if not tool_call.HasField("input"):
        return {}, "{}"
    text = tool_call.input.json
    return _convert.parse_json_object(text, "call.input"), text


def _keyed_tool_call(session: Session, tool_call: Any, key: str) -> ToolCallTask:
    """The call of idempotency key `key`: started under it as its task id, or the one already started."""
    if tool_call.task_id:
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST,
                       "give either call.task_id (attach) or idempotency_key, not both")
    name, (tool_input, input_json) = tool_call.name, _tool_input(tool_call)
    return session.calls.run_once(
        key, call_fingerprint("tool", name, tool_input),
        lambda task_id: session.calls.start(session.host, name, tool_input, task_id=task_id, input_json=input_json),
    )


def _keyed_scoring(session: Session, request: pb.ScoreGroupRequest) -> ToolCallTask:
    """The scoring of idempotency key `request.idempotency_key`, as `_keyed_tool_call`:
    started under it, or the one already started with the same candidates."""
    if request.task_id:
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST,
                       "give either task_id (attach) or idempotency_key, not both")
    candidates = _convert.group_candidates_from_proto(request.candidates)
    sent = [candidate.model_dump(mode="json") for candidate in candidates]
    return session.calls.run_once(
        request.idempotency_key, call_fingerprint("score_group", "", sent),
        lambda task_id: session.calls.start_scoring(session.host, candidates, task_id=task_id),
    )


async def _scoring_outcome_event(session: Session, call: ToolCallTask) -> pb.ScoreGroupResponse:
    """Waits for a scoring to end: its scores, or its failure."""
    outcome = await call.outcome()
    session.touch()
    if outcome.error is not None:
        raise outcome.error
    if outcome.failure is None:
        return pb.ScoreGroupResponse(result=pb.ScoreGroupResult(scores=_convert.group_scores_to_proto(outcome.result)))
    return pb.ScoreGroupResponse(failure=pb.ScoreGroupFailure(message=outcome.failure))


async def _write_outcome(session: Session, call: ToolCallTask, event: pb.CallToolResponse) -> CallOutcome:
    """Waits for a call to end and writes its result, or its failure when the
    tool raised, into `event` (a CallTool event, or a RunEpisode answer's
    `call_tool`): the result message is copied once, not once per enclosing
    message a constructor would copy it into. Returns the outcome; raises the
    error of a call whose environment's process ended under it."""
    outcome = await call.outcome()
    session.touch()
    if outcome.error is not None:
        raise outcome.error
    if outcome.message is not None:
        event.result.CopyFrom(outcome.message)
    elif outcome.result is not None:
        event.result.CopyFrom(_convert.run_tool_output_to_proto(outcome.result))
    else:
        event.failure.SetInParent()
        event.failure.message = outcome.failure or ""
    return outcome


def _size_around(text: str) -> int:
    """A bound on the size of an answer that holds `text` and no other content
    (a session or task id; a str is at most 4 bytes a character in UTF-8)."""
    return 4 * len(text) + _WRAPPING_BYTES


def _outcome_size(outcome: CallOutcome) -> int | None:
    """A bound on the size of the answer that carries `outcome` (its result
    was measured as it was made), None when unknown."""
    if outcome.message is not None:
        return outcome.message_bytes + _WRAPPING_BYTES
    if outcome.result is None:
        return _size_around(outcome.failure or "")
    return None


class EnvironmentService(pb_grpc.EnvironmentServiceServicer):
    """Serves ORS environments and owns their sessions."""

    def __init__(
        self, environments: Sequence[type[Environment]], sessions: SessionTable, toolsets: ToolsetRegistry = (),
        *, drain: Drain, max_message_bytes: int | None = None,
    ) -> None:
        self._envs = environment_map(environments)
        self._sessions = sessions
        self._drain = drain
        self._toolsets = toolset_map(toolsets)
        #: Answers larger than this fail with MESSAGE_TOO_LARGE (None: no check).
        self._max_message_bytes = max_message_bytes
        #: The gRPC door's address (`HOST:PORT`) as the proxy knows it: the
        #: session ids CreateSessionId hands out name it (`routed_ids`). None: plain ids.
        self.route_address: str | None = None

    def _within_limit(self, message: Any, what: str, size_at_most: int | None = None) -> Any:
        """`message`, unless it is over the message limit: then ORSError
        MESSAGE_TOO_LARGE, raised here rather than by grpc (which would end
        the call with no reason and log a traceback) and the same for the
        in-process channel, which has no limit of its own. `size_at_most`: a
        bound on its size the caller knows; it is measured (which costs as
        much as writing it out) only when that bound does not clear the limit."""
        limit = self._max_message_bytes
        if limit is not None and (size_at_most is None or size_at_most > limit):
            size = message.ByteSize()
            if size > limit:
                raise message_too_large(what, size, limit)
        return message

    def _session_id(self, request: Any, context: grpc.aio.ServicerContext, *, creating: bool = False) -> str:
        """The session a request names (see `_session_id`). A different
        `x-session-id` metadata entry is refused when it would misroute: on a
        creation, and on an episode this server holds unless it is the route
        key of the RunEpisode stream that created it. About an episode this
        server does not hold, the request goes on to its own answer
        (SESSION_NOT_FOUND, or a lingering record): a client whose stream's
        backend died learns that its episode is gone, not that it misrouted."""
        sid = _session_id(request, context)
        routed = _metadata_session_id(context)
        if routed and routed != sid:
            session = self._sessions.find(sid)
            if creating or (session is not None and session.route_key != routed):
                raise ORSError(errors_pb2.ERROR_REASON_SESSION_ID_MISMATCH,
                               "the request's session_id and its x-session-id metadata name different sessions")
        return sid

    # Discovery -------------------------------------------------------------

    def _env_cls(self, env_name: str) -> type[Environment]:
        env_cls = self._envs.get(env_name.lower())
        if env_cls is None:
            raise ORSError(errors_pb2.ERROR_REASON_UNKNOWN_ENVIRONMENT, unknown_environment(env_name, list(self._envs)))
        return env_cls

    def _catalog(self, env_name: str) -> CatalogHost:
        """The host of an environment's class-level calls."""
        return self._sessions.hosts.catalog(self._env_cls(env_name))

    async def _splits(self, catalog: CatalogHost) -> list[Split | str]:
        with _environment_code():
            return await catalog.list_splits()

    async def _check_split(self, catalog: CatalogHost, split: str) -> None:
        names = [_convert.split_to_proto(s).name for s in await self._splits(catalog)]
        if split not in names:
            raise ORSError(errors_pb2.ERROR_REASON_INVALID_SPLIT,
                           invalid_split(split, catalog.env_cls.name().lower(), names))

    async def _num_tasks_if_known(self, catalog: CatalogHost, split: str) -> int | None:
        """For a refusal's text: the split's size, or None when the environment cannot say (its own error is logged)."""
        try:
            with _environment_code():
                return await catalog.num_tasks(split)
        except ORSError:
            return None

    async def _get_task(self, env_cls: type[Environment], split: str, index: int) -> Any:
        """Task `index` of `split`. A negative index counts from the end, as the reference's
        `tasks[index]` does, for every environment: -1 is the last task (docs/http-bridge.md)."""
        catalog = self._sessions.hosts.catalog(env_cls)
        await self._check_split(catalog, split)
        if index < 0:
            with _environment_code():
                count = await catalog.num_tasks(split)
            if index < -count:
                raise ORSError(errors_pb2.ERROR_REASON_INVALID_INDEX, invalid_index(index, split, count))
            index += count
        try:
            with _environment_code(answered=(IndexError,)):
                return await catalog.get_task(split, index)
        except IndexError:
            raise ORSError(errors_pb2.ERROR_REASON_INVALID_INDEX,
                           invalid_index(index, split, await self._num_tasks_if_known(catalog, split))) from None

    @_unary
    async def Health(self, request: pb.HealthRequest, context: Any) -> pb.HealthResponse:
        return pb.HealthResponse(status="ok", open_sessions=self._sessions.open_count)

    @_unary
    async def Version(self, request: pb.VersionRequest, context: Any) -> pb.VersionResponse:
        return pb.VersionResponse(version=__version__)

    @_unary
    async def ListEnvironments(self, request: Any, context: Any) -> pb.ListEnvironmentsResponse:
        return pb.ListEnvironmentsResponse(names=list(self._envs))

    @_unary
    async def ListTools(self, request: pb.ListToolsRequest, context: Any) -> pb.ListToolsResponse:
        catalog = self._catalog(request.env_name)
        return pb.ListToolsResponse(**_convert.tool_listing(await catalog.list_tools()))

    @_unary
    async def ListSplits(self, request: pb.ListSplitsRequest, context: Any) -> pb.ListSplitsResponse:
        catalog = self._catalog(request.env_name)
        return pb.ListSplitsResponse(splits=[_convert.split_to_proto(s) for s in await self._splits(catalog)])

    @_unary
    async def ListTasks(self, request: pb.ListTasksRequest, context: Any) -> pb.ListTasksResponse:
        catalog = self._catalog(request.env_name)
        await self._check_split(catalog, request.split)
        try:
            with _environment_code(answered=(NotImplementedError,)):
                tasks = await catalog.list_tasks(request.split)
        except NotImplementedError:
            raise ORSError(errors_pb2.ERROR_REASON_LISTING_UNSUPPORTED, LISTING_UNSUPPORTED_MESSAGE) from None
        return pb.ListTasksResponse(
            tasks=[_convert.task_to_proto(task) for task in tasks], env_name=request.env_name
        )

    @_unary
    async def NumTasks(self, request: pb.NumTasksRequest, context: Any) -> pb.NumTasksResponse:
        catalog = self._catalog(request.env_name)
        await self._check_split(catalog, request.split)
        with _environment_code():
            num_tasks = await catalog.num_tasks(request.split)
        return pb.NumTasksResponse(num_tasks=num_tasks)

    @_unary
    async def GetTask(self, request: pb.GetTaskRequest, context: Any) -> pb.GetTaskResponse:
        env_cls = self._env_cls(request.env_name)
        task = await self._get_task(env_cls, request.split, request.index)
        return pb.GetTaskResponse(task=_convert.task_to_proto(task))

    @_unary
    async def GetTaskRange(self, request: pb.GetTaskRangeRequest, context: Any) -> pb.GetTaskRangeResponse:
        catalog = self._catalog(request.env_name)
        await self._check_split(catalog, request.split)
        start = request.start if request.HasField("start") else None
        stop = request.stop if request.HasField("stop") else None
        try:
            with _environment_code(answered=(IndexError,)):
                tasks = await catalog.get_task_range(request.split, start, stop)
        except IndexError:
            raise ORSError(errors_pb2.ERROR_REASON_INVALID_INDEX,
                           invalid_index_range(request.split, await self._num_tasks_if_known(catalog, request.split))) from None
        return pb.GetTaskRangeResponse(tasks=[_convert.task_to_proto(task) for task in tasks])

    # Sessions and episodes ---------------------------------------------------

    @_unary
    async def CreateSessionId(self, request: Any, context: Any) -> pb.CreateSessionIdResponse:
        sid = self._sessions.issue_id()
        if self.route_address is not None:
            sid = routed_id(self.route_address, sid)
        return pb.CreateSessionIdResponse(session_id=sid)

    @_unary
    async def CreateEpisode(self, request: pb.CreateEpisodeRequest, context: Any) -> pb.CreateEpisodeResponse:
        sid = self._session_id(request, context, creating=True)
        await self._create_episode(sid, request, api_key=_api_key(context))
        return pb.CreateEpisodeResponse(session_id=sid)

    @_unary
    async def GetPrompt(self, request: pb.GetPromptRequest, context: Any) -> pb.GetPromptResponse:
        return await self._prompt(self._session_id(request, context), pb.GetPromptResponse())

    @_unary
    async def ListTaskTools(self, request: pb.ListTaskToolsRequest, context: Any) -> pb.ListTaskToolsResponse:
        return await self._task_tools(self._session_id(request, context))

    async def CallTool(self, request: pb.CallToolRequest, context: Any) -> AsyncIterator[pb.CallToolResponse]:
        """A call's task id, then its result or failure. (As `_streaming`, but its events' size is checked
        here, where bounds on them are known; one generator, not one around another, since each message
        passes every generator in the chain.)"""
        async with _answering(self._drain, "CallTool", context):
            session = await self._sessions.ready(self._session_id(request, context))
            tool_call = request.call
            if request.idempotency_key:
                call = _keyed_tool_call(session, tool_call, request.idempotency_key)
            elif tool_call.task_id:
                call = session.calls.attach(tool_call.task_id)
            else:
                tool_input, input_json = _tool_input(tool_call)
                call = session.calls.start(session.host, tool_call.name, tool_input, input_json=input_json)
            yield self._within_limit(pb.CallToolResponse(task_id=call.task_id), _CALL_TOOL_EVENT,
                                     _size_around(call.task_id))
            event = pb.CallToolResponse()
            outcome = await _write_outcome(session, call, event)
            yield self._within_limit(event, _CALL_TOOL_EVENT, _outcome_size(outcome))

    async def _create_episode(self, sid: str, request: pb.CreateEpisodeRequest, api_key: str = "") -> None:
        self._sessions.check_can_create(sid)
        env_cls = self._env_cls(request.env_name) if request.env_name else next(iter(self._envs.values()))
        source = request.WhichOneof("task_source")
        task_json = None  # the task spec's JSON text, when the request carried it (the record keeps it)
        if source == "task_spec":
            task_json = request.task_spec.json
            task_spec = _convert.parse_json_object(task_json, "task_spec")
        elif source == "task_index":
            task_spec = await self._get_task(env_cls, request.task_index.split, request.task_index.index)
        else:
            raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST,
                           "Provide either task_spec or both split and index, not both/neither")
        toolset_name = request.toolset_name if request.HasField("toolset_name") else None
        toolset_cls = self._toolset_cls(toolset_name) if toolset_name is not None else None
        await self._sessions.create(sid, env_cls, task_spec, dict(request.secrets), api_key, toolset_cls, toolset_name,
                                    task_json=task_json)

    def _toolset_cls(self, name: str) -> type:
        toolset_cls = self._toolsets.get(name)
        if toolset_cls is None:
            raise ORSError(errors_pb2.ERROR_REASON_UNKNOWN_TOOLSET,
                           f"unknown toolset {name!r}; valid options are {sorted(self._toolsets)}")
        return toolset_cls

    async def _prompt(self, sid: str, answer: pb.GetPromptResponse) -> pb.GetPromptResponse:
        """The episode's prompt, written into `answer` (GetPrompt's, or a RunEpisode answer's `get_prompt`)."""
        session = await self._sessions.ready(sid)
        if session.host.implements("get_prompt"):
            blocks = await _session_code(session, session.host.prompt())
        else:  # a conversation-shaped environment: its messages, flattened
            blocks = flatten_messages(await self._session_messages(session))
        answer.SetInParent()  # (an empty prompt too)
        _convert.write_blocks(answer.blocks, blocks)
        return answer

    async def _session_messages(self, session: Session) -> Sequence[Message]:
        """The environment's `get_messages`, validated as Messages."""
        messages = await _session_code(session, session.host.messages())
        with _environment_code(session.redact):  # what it returned cannot be sent
            return [Message.model_validate(m) if not isinstance(m, Message) else m for m in messages]

    async def _messages(self, sid: str) -> pb.GetMessagesResponse:
        session = await self._sessions.ready(sid)
        if session.host.implements("get_messages"):
            messages = await self._session_messages(session)
        else:  # the default: the prompt as one user message
            messages = [Message(role="user", blocks=await _session_code(session, session.host.prompt()))]
        return pb.GetMessagesResponse(messages=_convert.messages_to_proto(messages))

    async def _task_tools(self, sid: str) -> pb.ListTaskToolsResponse:
        session = await self._sessions.ready(sid)
        tools: ListToolsOutput = await _session_code(session, session.host.task_tools())
        return pb.ListTaskToolsResponse(**_convert.tool_listing(tools))

    async def _scoring_session(self, sid: str) -> Session:
        """The session, once set up, if its environment implements score_group."""
        session = await self._sessions.ready(sid)
        if not session.host.implements("score_group"):
            raise ORSError(errors_pb2.ERROR_REASON_SCORE_GROUP_UNSUPPORTED,
                           f"Environment {session.env_cls.name().lower()!r} does not implement score_group")
        return session

    async def _scoring(self, sid: str, request: pb.ScoreGroupRequest) -> tuple[Session, ToolCallTask]:
        """The session and its scoring: a new one, the one of `task_id`, or the one of its idempotency key."""
        session = await self._scoring_session(sid)
        if request.idempotency_key:
            return session, _keyed_scoring(session, request)
        if request.task_id:
            return session, session.calls.attach(request.task_id, SCORE_GROUP)
        candidates = _convert.group_candidates_from_proto(request.candidates)
        return session, session.calls.start_scoring(session.host, candidates)

    async def _score_events(self, sid: str, request: pb.ScoreGroupRequest) -> AsyncIterator[pb.ScoreGroupResponse]:
        """A scoring's task id, then its result or failure (ScoreGroup's events)."""
        session, call = await self._scoring(sid, request)
        yield pb.ScoreGroupResponse(task_id=call.task_id)
        yield await _scoring_outcome_event(session, call)

    async def _stream_scoring(self, step: pb.ScoreGroupStep, stream_sid: str | None) -> pb.ScoreGroupResponse:
        """A RunEpisode score_group step: the scoring gets the client's task id; its outcome."""
        session = await self._scoring_session(_stream_session_id("", stream_sid))
        candidates = _convert.group_candidates_from_proto(step.candidates)
        call = session.calls.start_scoring(session.host, candidates, task_id=step.task_id)
        return await _scoring_outcome_event(session, call)

    @_unary
    async def GetMessages(self, request: pb.GetMessagesRequest, context: Any) -> pb.GetMessagesResponse:
        return await self._messages(self._session_id(request, context))

    @_streaming
    async def ScoreGroup(self, request: pb.ScoreGroupRequest, context: Any) -> AsyncIterator[pb.ScoreGroupResponse]:
        async for event in self._score_events(self._session_id(request, context), request):
            yield event

    async def _stream_tool_call(self, step: pb.ToolCallStep, stream_sid: str | None) -> pb.RunEpisodeResponse:
        """A RunEpisode call_tool step: the call gets the client's task id; its outcome."""
        # A ToolCallStep names no session: it always acts on the stream's.
        session = await self._sessions.ready(_stream_session_id("", stream_sid))
        tool_input, input_json = _tool_input(step)
        call = session.calls.start(session.host, step.name, tool_input, task_id=step.task_id, input_json=input_json)
        answer = pb.RunEpisodeResponse()
        outcome = await _write_outcome(session, call, answer.call_tool)
        return self._within_limit(answer, _STEP_ANSWERS["call_tool"], _outcome_size(outcome))

    @_unary
    async def Ping(self, request: pb.PingRequest, context: Any) -> pb.PingResponse:
        self._sessions.get(self._session_id(request, context))
        return pb.PingResponse(status="ok")

    @_unary
    async def DeleteEpisode(self, request: pb.DeleteEpisodeRequest, context: Any) -> pb.DeleteEpisodeResponse:
        sid = self._session_id(request, context)
        await self._sessions.delete(sid)
        return pb.DeleteEpisodeResponse(session_id=sid)

    @_unary
    async def DeleteSessionId(
        self, request: pb.DeleteSessionIdRequest, context: Any
    ) -> pb.DeleteSessionIdResponse:
        sid = self._session_id(request, context)
        await self._sessions.delete(sid)
        return pb.DeleteSessionIdResponse(session_id=sid)

    # One episode over one stream ----------------------------------------------

    async def RunEpisode(
        self, requests: AsyncIterator[pb.RunEpisodeRequest], context: Any
    ) -> AsyncIterator[pb.RunEpisodeResponse]:
        """Answers each step in order, once. An episode ends with a `delete`
        step only (then a `create` may start the next): grpc.aio ends the
        request iterator the same way on a half-close and on a cancelled call,
        so the end of the stream cannot tell a done client from a broken
        connection (whose episode must stay reachable, to attach to a call)."""
        # As `_streaming` would, but each answer is checked against the message
        # limit as it is made (bounds on some are known), not once more after.
        async with _answering(self._drain, "RunEpisode", context):
            route_key = _metadata_session_id(context)
            if route_key:
                # The stream's route key, answered: a proxy with stateful
                # sessions (Envoy's envelope) names in it the backend the
                # stream reached, so the client's per-step RPCs of this
                # stream's episodes reach it exactly too (`routed_ids`).
                await context.send_initial_metadata(((SESSION_ID_METADATA_KEY, route_key),))
            sid: str | None = None
            async for request in requests:
                step = request.WhichOneof("step")
                try:
                    if step == "call_tool":
                        answer = await self._stream_tool_call(request.call_tool, sid)
                    elif step == "create":
                        sid = await self._create_stream_episode(request.create, sid, context)
                        answer = pb.RunEpisodeResponse()
                        answer.create.session_id = sid  # (constructors copy a message given to them)
                        answer = self._within_limit(answer, _STEP_ANSWERS[step], _size_around(sid))
                    elif step == "delete":
                        deleted = _stream_session_id(request.delete.session_id, sid)
                        await self._sessions.delete(deleted)
                        sid = None
                        answer = pb.RunEpisodeResponse()
                        answer.delete.session_id = deleted
                        answer = self._within_limit(answer, _STEP_ANSWERS[step], _size_around(deleted))
                    else:
                        answer = self._within_limit(await self._episode_step(step, request, sid), _STEP_ANSWERS[step])
                except Exception as exc:
                    answer = pb.RunEpisodeResponse(error=_step_error(f"RunEpisode.{step}", exc))
                yield answer

    async def _create_stream_episode(
        self, request: pb.CreateEpisodeRequest, stream_sid: str | None, context: Any
    ) -> str:
        if stream_sid is not None:
            raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST,
                           "the stream's episode is still open: delete it before creating another")
        # Not the metadata's id: that routes the stream, which may carry many episodes.
        sid = _key(request.session_id) or _new_session_id()
        await self._create_episode(sid, request, api_key=_api_key(context))
        route_key = _metadata_session_id(context)
        if route_key and route_key != sid:
            # The episode's per-step RPCs may be routed by the stream's key.
            self._sessions.get(sid).route_key = route_key
        return sid

    async def _episode_step(
        self, step: str | None, request: pb.RunEpisodeRequest, stream_sid: str | None
    ) -> pb.RunEpisodeResponse:
        """The answer to a step within an episode."""
        if step == "get_prompt":
            answer = pb.RunEpisodeResponse()
            await self._prompt(_stream_session_id(request.get_prompt.session_id, stream_sid), answer.get_prompt)
            return answer
        if step == "list_task_tools":
            tools = await self._task_tools(_stream_session_id(request.list_task_tools.session_id, stream_sid))
            return pb.RunEpisodeResponse(list_task_tools=tools)
        if step == "get_messages":
            messages = await self._messages(_stream_session_id(request.get_messages.session_id, stream_sid))
            return pb.RunEpisodeResponse(get_messages=messages)
        if step == "score_group":
            return pb.RunEpisodeResponse(score_group=await self._stream_scoring(request.score_group, stream_sid))
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST, "the request has no step")

    # The episode record (an ORS extension) ------------------------------------

    @_unary
    async def GetEpisodeRecord(
        self, request: pb.GetEpisodeRecordRequest, context: Any
    ) -> pb.GetEpisodeRecordResponse:
        return pb.GetEpisodeRecordResponse(record=self._sessions.record(self._session_id(request, context)))

    # Warm episodes (an ORS extension) ----------------------------------------

    @_unary
    async def PrepareEpisodes(
        self, request: pb.PrepareEpisodesRequest, context: Any
    ) -> pb.PrepareEpisodesResponse:
        env_cls = self._env_cls(request.env_name) if request.env_name else next(iter(self._envs.values()))
        task_specs = await self._tasks_to_prepare(env_cls, request)
        session_ids = _ids_to_reserve(request, len(task_specs), _metadata_session_id(context))
        self._sessions.prepare(env_cls, task_specs, dict(request.secrets), _api_key(context), session_ids)
        return pb.PrepareEpisodesResponse(preparing=len(task_specs), ttl_seconds=self._sessions.warm.ttl_s)

    @_unary
    async def CancelPreparedEpisodes(
        self, request: pb.CancelPreparedEpisodesRequest, context: Any
    ) -> pb.CancelPreparedEpisodesResponse:
        env_cls = self._env_cls(request.env_name) if request.env_name else next(iter(self._envs.values()))
        task_specs = await self._tasks_to_prepare(env_cls, request, required=False)
        cancelled = self._sessions.warm.cancel(env_cls, task_specs, dict(request.secrets), _api_key(context))
        return pb.CancelPreparedEpisodesResponse(cancelled=cancelled)

    async def _tasks_to_prepare(
        self, env_cls: type[Environment], request: pb.PrepareEpisodesRequest | pb.CancelPreparedEpisodesRequest,
        required: bool = True,
    ) -> list[dict[str, Any]]:
        """The task specs of a PrepareEpisodes (or CancelPreparedEpisodes)
        request: given, or looked up by split and index (none at all: [],
        unless `required`)."""
        by_index = bool(request.split or request.indices)
        if not (required or by_index or request.task_specs):
            return []
        if bool(request.task_specs) == by_index or (by_index and not (request.split and request.indices)):
            raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST,
                           "Provide either task_specs or both split and indices, not both/neither")
        if max(len(request.task_specs), len(request.indices)) > MAX_PREPARE_PER_REQUEST:
            raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST,
                           f"at most {MAX_PREPARE_PER_REQUEST} episodes per request")
        if request.task_specs:
            return [_convert.load_json_object(spec, f"task_specs[{i}]") for i, spec in enumerate(request.task_specs)]
        return [await self._get_task(env_cls, request.split, index) for index in request.indices]

    # The live view (an ORS extension) -------------------------------------------

    @_unary
    async def GetServerStats(self, request: pb.GetServerStatsRequest, context: Any) -> pb.GetServerStatsResponse:
        open_sessions = self._sessions.open_by_environment()
        prepared = self._sessions.warm.count_by_environment()
        return pb.GetServerStatsResponse(
            environments=[
                self._environment_stats(name, env_cls, open_sessions[env_cls], prepared.get(env_cls, 0))
                for name, env_cls in self._envs.items()
            ],
            window_seconds=WINDOW_S,
        )

    def _environment_stats(
        self, name: str, env_cls: type[Environment], open_sessions: int, prepared: int
    ) -> pb.EnvironmentStats:
        counters = self._sessions.stats.of(env_cls)
        latency = counters.latency_ms(0.5, 0.99)
        return pb.EnvironmentStats(
            env_name=name,
            open_sessions=open_sessions,
            prepared_episodes=prepared,
            tool_calls_in_flight=counters.in_flight,
            tool_calls_per_second=counters.calls_per_second(),
            call_latency_p50_ms=latency[0] if latency else None,
            call_latency_p99_ms=latency[1] if latency else None,
            recent_errors=[
                pb.ServerError(time_unix_ms=error.time_unix_ms, source=error.source, message=error.message)
                for error in counters.recent_errors()
            ],
        )
    # Operators --------------------------------------------------------------

    @_unary
    async def Drain(self, request: pb.DrainRequest, context: Any) -> pb.DrainResponse:
        if not _is_loopback(context.peer()):
            raise ORSError(errors_pb2.ERROR_REASON_PEER_NOT_LOCAL,
                           "Drain is accepted from this host only (a loopback peer)")
        await self._drain.begin()
        return pb.DrainResponse(open_sessions=self._sessions.open_count, seconds_left=self._drain.seconds_left)


def _is_loopback(peer: str) -> bool:
    """Whether a grpc peer (`ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000`, `unix:...`) is on this host."""
    kind, _, address = peer.partition(":")
    if kind == "unix":
        return True
    host = address.rpartition(":")[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
