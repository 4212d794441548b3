"""The ORS HTTP/SSE API as an aiohttp application over the gRPC EnvironmentService.

Every handler translates one HTTP request into one RPC and back; the bridge
holds no session state. JSON <-> proto lives in `_convert`, gRPC failures
become HTTP statuses in the one error middleware (through
`ors_grpc.protocol.errors.http_status_for`), and SSE framing lives in `_sse`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

import grpc
from aiohttp import web

from ors_grpc._generated.ors.v1 import environment_service_pb2 as service_pb2
from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc._generated.ors.v1.environment_service_pb2_grpc import EnvironmentServiceStub
from ors_grpc.observability import tracing
from ors_grpc.protocol.browser_policy import BrowserPolicy
from ors_grpc.protocol.constants import DEFAULT_KEEPALIVE_INTERVAL_S, DEFAULT_MAX_MESSAGE_BYTES, SESSION_ID_HEADER
from ors_grpc.protocol.errors import RETRY_AFTER_S, bounded_text, ends_episode, http_status_for, unknown_environment
from ors_grpc.protocol.routed_ids import door_address, routed_id, session_key

from . import _convert as convert
from ._backend import EnvNames, call_metadata, error_reason, open_channel, retry_after
from ._browsers import browser_refusal, install_cors
from ._http_server import LIMITS, GuardedRunner, HttpLimits, body_pending, check_request, receive_body
from ._metrics import record_metrics
from ._sse import Event, SSEWriter, chunk_events, done_within, error_event, sse_response, wants_event_stream
from . import _openapi, _static, _tracing

__all__ = ["DEFAULT_MAX_BYTES", "HttpLimits", "create_app", "start_bridge"]

logger = logging.getLogger("http_bridge")

DEFAULT_MAX_BYTES = DEFAULT_MAX_MESSAGE_BYTES
#: Seconds an unread request body is drained after the answer (so that the
#: client reads a 413 rather than a reset connection).
LINGER_S = 1.0
#: A tool result that arrives within this long after the call's task id goes
#: out with it, as one response in one write; a slower one is streamed. Under
#: load (32 busy episodes) quick tools take 2 to 9 ms to come back.
QUICK_RESULT_S = 0.01

_UNKNOWN_TASK_ID = errors_pb2.ErrorReason.Name(errors_pb2.ERROR_REASON_UNKNOWN_TASK_ID)
_ENVIRONMENT_STARTING = errors_pb2.ErrorReason.Name(errors_pb2.ERROR_REASON_ENVIRONMENT_STARTING)

#: First path segments that are routes of their own, not environment names.
ROOT_SEGMENTS = frozenset(
    {"health", "version", "list_environments", "ping", "create", "delete", "create_session", "delete_session",
     "openapi.json", "docs", "server_stats", "", "playground"}
)


@dataclass(frozen=True)
class BridgeConfig:
    backend_target: str
    max_body_bytes: int
    max_message_bytes: int
    keepalive_interval_s: float
    env_cache_ttl_s: float
    tls_root_cert: Optional[str]
    tls_server_name: Optional[str]
    channel: Optional[Any]
    #: When set, `/create_session` names this host and the port the request
    #: came in on in the id it hands out (`routed_ids`): a proxy in front of
    #: this door sends the session's requests back to it.
    advertise_host: Optional[str] = None


CONFIG = web.AppKey("config", BridgeConfig)
STUB = web.AppKey("stub", EnvironmentServiceStub)
ENV_NAMES = web.AppKey("env_names", EnvNames)
BROWSER_POLICY = web.AppKey("browser_policy", BrowserPolicy)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def _json(value: Any, status: int = 200, headers: Optional[dict[str, str]] = None) -> web.Response:
    return web.Response(text=convert.dumps(value), status=status, headers=headers, content_type="application/json")


def _error(detail: str, status: int, headers: Optional[dict[str, str]] = None) -> web.Response:
    """`{"detail": ...}`, the text cut as every error text is (`bounded_text`)."""
    return _json({"detail": bounded_text(detail)}, status, headers)


#: Status of an answer to a client that left before its request was in
#: (nginx's "client closed request"); nobody reads it, the metrics count it.
CLIENT_CLOSED_REQUEST = 499


def _stub(request: web.Request) -> EnvironmentServiceStub:
    return request.app[STUB]


def _session_id(request: web.Request) -> str:
    session_id = request.headers.get(SESSION_ID_HEADER)
    if not session_id:
        raise convert.BadRequest(f"{SESSION_ID_HEADER} header is required", status=400)
    return session_id.strip()


async def _body(request: web.Request, model: type[convert.Body]) -> Any:
    return convert.parse_body(await request.read(), model)


# --------------------------------------------------------------------------
# Middlewares
# --------------------------------------------------------------------------


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes `{"detail": ...}` with its HTTP status; never a traceback."""
    try:
        return await handler(request)
    except convert.BadRequest as exc:
        return _error(exc.detail, exc.status)
    except grpc.aio.AioRpcError as exc:
        return _rpc_error(exc)
    except UnicodeEncodeError:
        # Request text protobuf refused (a route's input not checked by
        # _convert or check_request): the client's, so 400, and unquoted.
        return _error("Request text is not valid UTF-8 (undecodable bytes or a lone surrogate)", 400)
    except web.HTTPRequestEntityTooLarge:
        return _error(_body_too_large(request.content_length, request.app[CONFIG].max_body_bytes), 413)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return _error(exc.reason, exc.status, headers)
    except ConnectionResetError:
        # The client left mid-body (or mid-answer): its doing, not a fault here.
        logger.info("http_client_disconnected method=%s path=%s", request.method, request.path)
        return web.Response(status=CLIENT_CLOSED_REQUEST)
    except Exception:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return _error("Internal Server Error", 500)


def _body_too_large(size_bytes: int | None, limit_bytes: int) -> str:
    """The 413's text: the limit, as the gRPC door's MESSAGE_TOO_LARGE says it (`message_too_large`)."""
    size = f"is {size_bytes} bytes, " if size_bytes is not None else "is "
    return f"Request Entity Too Large: the request body {size}over the server's body limit of {limit_bytes} bytes"


def _rpc_error(exc: grpc.aio.AioRpcError) -> web.Response:
    reason = error_reason(exc)
    status = http_status_for(exc.code(), reason)
    detail = exc.details() or exc.code().name
    headers = None
    if exc.code() == grpc.StatusCode.UNAVAILABLE and reason is None:
        # The backend is down or restarting; the gRPC detail names internal
        # addresses, so keep it out. Both clients retry 503s.
        detail = "ORS backend unavailable, retry shortly"
    if reason == _ENVIRONMENT_STARTING:
        # As the openreward server answers a call that waited out its bound
        # on setup(); its clients keep retrying while `starting` is said.
        seconds = retry_after(exc) or str(RETRY_AFTER_S[errors_pb2.ERROR_REASON_ENVIRONMENT_STARTING])
        headers = {"X-Backend-State": "starting", "Retry-After": seconds}
    elif status in (429, 503):
        # The service's own retry-after (a draining or full server), else 1 s.
        headers = {"Retry-After": retry_after(exc) or "1"}
    return _error(detail, status, headers)


@web.middleware
async def before_routes(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The checks every request passes before its route, in order: the
    browser policy (`_browsers`), the request's own limits (`_http_server`),
    the default environment (`_default_env`). Plain functions in one
    middleware rather than one middleware each: a handler's every wake-up
    passes back through each middleware's frame around it."""
    refusal = browser_refusal(request.app[BROWSER_POLICY], request)
    if refusal is not None:
        return refusal
    check_request(request)
    if body_pending(request):
        refusal = await receive_body(request)
        if refusal is not None:
            return refusal
    refusal = await _default_env(request)
    if refusal is not None:
        return refusal
    return await handler(request)


async def _default_env(request: web.Request) -> Optional[web.Response]:
    """308 from a bare environment route (`/tools`, `/call`, ...) to the default (first)
    environment's, as the reference does; 404 naming the hosted environments for
    `/{unknown}/...`, where the reference's 308 would lead to a bare 404."""
    segments = request.path.strip("/").split("/")
    first_segment = segments[0].lower()
    if first_segment in ROOT_SEGMENTS:
        return None
    metadata = call_metadata(request)
    env_names = request.app[ENV_NAMES]
    names = env_names.cached(metadata)
    if names is None:
        names = await env_names.get(metadata)
    if names and first_segment not in names:
        if len(segments) == 1 and first_segment in _env_route_names():
            location = f"/{names[0]}{request.rel_url.raw_path}"
            if request.query_string:
                location += f"?{request.query_string}"
            raise web.HTTPPermanentRedirect(location)
        if len(segments) > 1:
            return _error(unknown_environment(segments[0], names), 404)
    return None


@functools.cache
def _env_route_names() -> frozenset[str]:
    """The routes under `/{env}/` (tools, splits, call, ...): their bare forms redirect."""
    prefix = "/{env}/"
    return frozenset(route.path[len(prefix):] for route in _routes() if route.path.startswith(prefix))


# --------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    try:
        await _stub(request).Health(service_pb2.HealthRequest(), metadata=call_metadata(request))
    except grpc.aio.AioRpcError as exc:
        # A backend that refuses the key is still up; /health needs no key.
        if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
            raise
    return _json({"status": "ok"})


async def version(request: web.Request) -> web.Response:
    response = await _stub(request).Version(service_pb2.VersionRequest(), metadata=call_metadata(request))
    return _json({"version": response.version})


async def list_environments(request: web.Request) -> web.Response:
    rpc_request = service_pb2.ListEnvironmentsRequest()
    response = await _stub(request).ListEnvironments(rpc_request, metadata=call_metadata(request))
    return _json(list(response.names))


async def list_tools(request: web.Request) -> web.Response:
    rpc_request = service_pb2.ListToolsRequest(env_name=request.match_info["env"])
    response = await _stub(request).ListTools(rpc_request, metadata=call_metadata(request))
    return _json(convert.tool_listing_json(response))


async def list_splits(request: web.Request) -> web.Response:
    rpc_request = service_pb2.ListSplitsRequest(env_name=request.match_info["env"])
    response = await _stub(request).ListSplits(rpc_request, metadata=call_metadata(request))
    return _json([convert.split_json(split) for split in response.splits])


async def list_tasks(request: web.Request) -> web.Response:
    body = await _body(request, convert.SplitBody)
    rpc_request = service_pb2.ListTasksRequest(env_name=request.match_info["env"], split=body.split)
    response = await _stub(request).ListTasks(rpc_request, metadata=call_metadata(request))
    return _json({"tasks": [convert.task_json(task) for task in response.tasks], "env_name": response.env_name})


async def num_tasks(request: web.Request) -> web.Response:
    body = await _body(request, convert.SplitBody)
    rpc_request = service_pb2.NumTasksRequest(env_name=request.match_info["env"], split=body.split)
    response = await _stub(request).NumTasks(rpc_request, metadata=call_metadata(request))
    return _json({"num_tasks": response.num_tasks})


async def get_task(request: web.Request) -> web.Response:
    body = await _body(request, convert.TaskBody)
    rpc_request = convert.task_request(request.match_info["env"], body)
    response = await _stub(request).GetTask(rpc_request, metadata=call_metadata(request))
    # `env_name` is not in the reference's answer, but the openreward client reads it.
    return _json({"task": convert.task_json(response.task), "env_name": request.match_info["env"]})


async def get_task_range(request: web.Request) -> web.Response:
    body = await _body(request, convert.TaskRangeBody)
    rpc_request = convert.task_range_request(request.match_info["env"], body)
    response = await _stub(request).GetTaskRange(rpc_request, metadata=call_metadata(request))
    tasks = [convert.task_json(task) for task in response.tasks]
    # `env_name` is not in the reference's answer, but the openreward client reads it.
    return _json({"tasks": tasks, "env_name": request.match_info["env"]})


# --------------------------------------------------------------------------
# Sessions and episodes
# --------------------------------------------------------------------------


async def create_session(request: web.Request) -> web.StreamResponse:
    """A new session id: SSE (what both Python clients read) or JSON, by Accept."""
    rpc_request = service_pb2.CreateSessionIdRequest()
    response = await _stub(request).CreateSessionId(rpc_request, metadata=call_metadata(request))
    sid = response.session_id
    advertise_host = request.app[CONFIG].advertise_host
    if advertise_host is not None:
        # This door's address, not the gRPC door's: the proxy reaches this door directly.
        port = request.transport.get_extra_info("sockname")[1] if request.transport is not None else 0
        sid = routed_id(door_address(advertise_host, port), session_key(sid))
    if not wants_event_stream(request):
        return _json({"sid": sid})
    return sse_response([("task_id", sid), ("end", "")])


async def create_episode(request: web.Request) -> web.Response:
    raw = await request.read()
    session_id = _session_id(request)
    body = convert.parse_body(raw, convert.CreateBody)
    header_secrets = convert.secrets_from_header(request.headers.get("X-Secrets"))
    rpc_request = convert.create_episode_request(session_id, body, header_secrets)
    await _stub(request).CreateEpisode(rpc_request, metadata=call_metadata(request, session_id))
    return _json({"sid": session_id})


async def ping(request: web.Request) -> web.Response:
    session_id = _session_id(request)
    rpc_request = service_pb2.PingRequest(session_id=session_id)
    response = await _stub(request).Ping(rpc_request, metadata=call_metadata(request, session_id))
    return _json({"status": response.status or "ok"})


async def delete_episode(request: web.Request) -> web.Response:
    session_id = _session_id(request)
    rpc_request = service_pb2.DeleteEpisodeRequest(session_id=session_id)
    await _stub(request).DeleteEpisode(rpc_request, metadata=call_metadata(request, session_id))
    return _json({"sid": session_id})


async def delete_session(request: web.Request) -> web.Response:
    session_id = _session_id(request)
    rpc_request = service_pb2.DeleteSessionIdRequest(session_id=session_id)
    await _stub(request).DeleteSessionId(rpc_request, metadata=call_metadata(request, session_id))
    return _json({"sid": session_id})


async def get_prompt(request: web.Request) -> web.Response:
    session_id = _session_id(request)
    rpc_request = service_pb2.GetPromptRequest(session_id=session_id)
    response = await _stub(request).GetPrompt(rpc_request, metadata=call_metadata(request, session_id))
    return _json(convert.blocks_json(response.blocks))


async def task_tools(request: web.Request) -> web.Response:
    session_id = _session_id(request)
    rpc_request = service_pb2.ListTaskToolsRequest(session_id=session_id)
    response = await _stub(request).ListTaskTools(rpc_request, metadata=call_metadata(request, session_id))
    return _json(convert.tool_listing_json(response))


async def get_messages(request: web.Request) -> web.Response:
    session_id = _session_id(request)
    rpc_request = service_pb2.GetMessagesRequest(session_id=session_id)
    response = await _stub(request).GetMessages(rpc_request, metadata=call_metadata(request, session_id))
    return _json(convert.messages_json(response.messages))


# --------------------------------------------------------------------------
# Tool calls over SSE
# --------------------------------------------------------------------------


async def call_tool(request: web.Request) -> web.StreamResponse:
    """Run a tool (or attach to a running call by `task_id`) and stream its result."""
    raw = await request.read()
    session_id = _session_id(request)
    body = convert.parse_body(raw, convert.CallBody)
    # Exactly once: the key becomes the call's task id (see docs/http-bridge.md).
    key = convert.idempotency_key(request.headers.get("Idempotency-Key"))
    stream = _stub(request).CallTool(
        convert.tool_call_request(session_id, body, key), metadata=call_metadata(request, session_id)
    )
    return await _task_events(request, stream, convert.run_tool_result_json)


async def score_group(request: web.Request) -> web.StreamResponse:
    """Score a group of candidates (or attach to a scoring by `task_id`): SSE as `/call`."""
    raw = await request.read()
    session_id = _session_id(request)
    body = convert.parse_body(raw, convert.ScoreGroupBody)
    # Exactly once, as for /call: the key becomes the scoring's task id.
    key = convert.idempotency_key(request.headers.get("Idempotency-Key"))
    stream = _stub(request).ScoreGroup(
        convert.score_group_request(session_id, body, key), metadata=call_metadata(request, session_id)
    )
    return await _task_events(request, stream, convert.score_group_result_json)


#: The JSON payload of a task stream's `result` message.
ResultJson = Callable[[Any], str]


async def _task_events(request: web.Request, stream: Any, result_json: ResultJson) -> web.StreamResponse:
    """A task stream (CallTool, ScoreGroup) as SSE: `task_id`, then `chunk`*/`end` or `error`.

    The HTTP status is sent only once the backend has sent the task id, so
    that errors before it (unknown session, setup failed, session deleted,
    score_group unsupported) are real HTTP statuses; so is a status that
    ends the episode (`errors.ends_episode`: ENVIRONMENT_CRASHED, its process
    died under it) while no byte has gone out yet. Any other failure after
    the task id is an SSE `error` event, a status's carrying its reason.
    """
    outcome: Optional[asyncio.Future] = None
    try:
        try:
            first = await stream.read()
        except grpc.aio.AioRpcError as exc:
            if error_reason(exc) == _UNKNOWN_TASK_ID:
                # The reference answers an unknown task id in-band, with this message.
                return sse_response([("error", "unknown task_id")])
            raise
        if first is grpc.aio.EOF or first.WhichOneof("event") != "task_id":
            raise web.HTTPBadGateway(reason="The ORS backend ended the call without a task id")
        outcome = asyncio.ensure_future(stream.read())
        await done_within(outcome, QUICK_RESULT_S)
        if outcome.done():
            if not outcome.cancelled() and _ended_episode(outcome.exception()):
                raise outcome.exception()  # nothing sent yet: a real HTTP status
            return sse_response([("task_id", first.task_id), *_outcome_events(outcome, result_json)])
        return await _stream_call(request, first.task_id, outcome, result_json)
    finally:
        # Ends our watching only: the backend never cancels a task with its stream.
        if outcome is not None:
            outcome.cancel()
        stream.cancel()


async def _stream_call(
    request: web.Request, task_id: str, outcome: asyncio.Future, result_json: ResultJson
) -> web.StreamResponse:
    """The task id now, `: ping` while the task runs, then its outcome."""
    writer = SSEWriter(request)
    await writer.start()
    try:
        await writer.event("task_id", task_id)
        await writer.wait_with_keepalive(outcome, request.app[CONFIG].keepalive_interval_s)
        await writer.events(_outcome_events(outcome, result_json))
        await writer.finish()
    except ConnectionResetError:
        pass  # The client left; it may attach again by task id.
    return writer.response


def _outcome_events(outcome: asyncio.Future, result_json: ResultJson) -> list[Event]:
    """A task's result as `chunk`*/`end`, or its failure as `error`, from the
    finished read of the stream's second message."""
    try:
        message = outcome.result()
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) and error_reason(exc) is None:
            # The backend went away mid-call: end the stream without `end`,
            # so the client reconnects with the task id instead of giving up.
            return []
        return [error_event(bounded_text(exc.details() or exc.code().name), error_reason(exc))]
    if message is grpc.aio.EOF:
        return []
    event = message.WhichOneof("event")
    if event == "result":
        return chunk_events(result_json(message.result))
    if event == "failure":
        return [("error", bounded_text(message.failure.message))]
    return []


def _ended_episode(error: BaseException | None) -> bool:
    """Whether a task stream ended with a status saying its episode is gone."""
    return isinstance(error, grpc.aio.AioRpcError) and ends_episode(error_reason(error))


# --------------------------------------------------------------------------
# Extensions of ORS
# --------------------------------------------------------------------------


async def server_stats(request: web.Request) -> web.Response:
    """The backend's counters per environment (read-only), for the playground's live view."""
    rpc_request = service_pb2.GetServerStatsRequest()
    response = await _stub(request).GetServerStats(rpc_request, metadata=call_metadata(request))
    return _json(convert.server_stats_json(response))


async def prepare_episodes(request: web.Request) -> web.Response:
    """Warm episodes: set up episodes of the given tasks ahead, for `/create` to claim."""
    body = await _body(request, convert.PrepareBody)
    header_secrets = convert.secrets_from_header(request.headers.get("X-Secrets"))
    session_id = request.headers.get(SESSION_ID_HEADER)
    rpc_request = convert.prepare_episodes_request(request.match_info["env"], body, header_secrets, session_id)
    response = await _stub(request).PrepareEpisodes(rpc_request, metadata=call_metadata(request, session_id))
    return _json({"preparing": response.preparing, "ttl_seconds": response.ttl_seconds})


async def cancel_prepared(request: web.Request) -> web.Response:
    """Warm episodes: cancel held ones (those given, or all of the environment) prepared with these secrets."""
    body = await _body(request, convert.CancelPreparedBody)
    header_secrets = convert.secrets_from_header(request.headers.get("X-Secrets"))
    rpc_request = convert.cancel_prepared_request(request.match_info["env"], body, header_secrets)
    response = await _stub(request).CancelPreparedEpisodes(rpc_request, metadata=call_metadata(request))
    return _json({"cancelled": response.cancelled})


async def episode_record(request: web.Request) -> web.Response:
    """What happened in the session's episode (live, or ended within the linger time)."""
    session_id = _session_id(request)
    rpc_request = service_pb2.GetEpisodeRecordRequest(session_id=session_id)
    response = await _stub(request).GetEpisodeRecord(rpc_request, metadata=call_metadata(request, session_id))
    return _json(convert.episode_record_json(response.record))


# --------------------------------------------------------------------------
# The application
# --------------------------------------------------------------------------


def _routes() -> list[web.RouteDef]:
    return [
        web.get("/health", health),
        web.get("/version", version),
        web.get("/list_environments", list_environments),
        web.post("/create_session", create_session),
        web.post("/create", create_episode),
        web.post("/ping", ping),
        web.post("/delete", delete_episode),
        web.post("/delete_session", delete_session),
        # aiohttp tries the `/{env}/...` patterns one by one, in this order:
        # an episode's own routes first (five calls and a prompt an episode).
        web.post("/{env}/call", call_tool),
        web.get("/{env}/prompt", get_prompt),
        web.get("/{env}/task_tools", task_tools),
        web.get("/{env}/messages", get_messages),
        web.post("/{env}/score_group", score_group),
        web.get("/{env}/tools", list_tools),
        web.get("/{env}/splits", list_splits),
        web.post("/{env}/tasks", list_tasks),
        web.post("/{env}/num_tasks", num_tasks),
        web.post("/{env}/task", get_task),
        web.post("/{env}/get_task", get_task),
        web.post("/{env}/task_range", get_task_range),
        web.post("/{env}/get_task_range", get_task_range),
        web.post("/{env}/prepare", prepare_episodes),
        web.post("/{env}/cancel_prepared", cancel_prepared),
        web.get("/{env}/episode", episode_record),
        web.get("/server_stats", server_stats),
    ]


async def _backend_channel(app: web.Application) -> Any:
    """One long-lived gRPC channel for the app's lifetime (or the given one)."""
    config = app[CONFIG]
    channel = config.channel or open_channel(
        config.backend_target,
        max_message_bytes=config.max_message_bytes,
        tls_root_cert=config.tls_root_cert,
        tls_server_name=config.tls_server_name,
    )
    app[STUB] = EnvironmentServiceStub(tracing.propagating(channel))
    app[ENV_NAMES] = EnvNames(app[STUB], config.env_cache_ttl_s)
    yield
    await channel.close()


def create_app(
    backend_target: str,
    *,
    max_body_bytes: int = DEFAULT_MAX_BYTES,
    max_message_bytes: int = DEFAULT_MAX_BYTES,
    keepalive_interval_s: float = DEFAULT_KEEPALIVE_INTERVAL_S,
    env_cache_ttl_s: float = 5.0,
    tls_root_cert: Optional[str] = None,
    tls_server_name: Optional[str] = None,
    channel: Optional[Any] = None,
    http_limits: HttpLimits = HttpLimits(),
    browser_policy: Optional[BrowserPolicy] = None,
    advertise_host: Optional[str] = None,
) -> web.Application:
    """The HTTP/SSE bridge in front of the gRPC backend at `backend_target` ("host:port").

    `max_body_bytes` bounds request bodies (413 above it); `max_message_bytes`
    bounds gRPC messages both ways; a `: ping` comment is sent every
    `keepalive_interval_s` while a tool runs. With `tls_root_cert` (a PEM
    path) the backend is reached over TLS. A given `channel` (such as
    `ors_grpc.server.in_process_channel(server)`) is used instead of opening one.
    `http_limits` are the HTTP port's timeouts and caps (see `_http_server`).
    `browser_policy` says which `Host` and `Origin` are served (see `_browsers`;
    None: a loopback-bound door's, with nothing more allowed).
    `advertise_host`: see `BridgeConfig.advertise_host` (`serve --advertise-host`).
    """
    policy = browser_policy or BrowserPolicy.for_bind("127.0.0.1")
    app = web.Application(
        middlewares=[record_metrics, errors_as_json, before_routes],
        client_max_size=max_body_bytes,
    )
    install_cors(app, policy)
    app[BROWSER_POLICY] = policy
    app[LIMITS] = http_limits
    app[CONFIG] = BridgeConfig(
        backend_target=backend_target,
        max_body_bytes=max_body_bytes,
        max_message_bytes=max_message_bytes,
        keepalive_interval_s=keepalive_interval_s,
        env_cache_ttl_s=env_cache_ttl_s,
        tls_root_cert=tls_root_cert,
        tls_server_name=tls_server_name,
        channel=channel,
        advertise_host=advertise_host,
    )
    app.cleanup_ctx.append(_backend_channel)
    app.add_routes(_routes())
    app.add_routes(_openapi.routes())  # /openapi.json
    app.add_routes(_static.routes())  # the playground at /, Swagger UI at /docs
    _tracing.install(app)  # only while tracing is on
    return app


async def start_bridge(
    backend_target: str,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    ssl_context: Optional[ssl.SSLContext] = None,
    **options: Any,
) -> tuple[web.AppRunner, int]:
    """Start the bridge on host:port (0 picks a free port); returns the runner and the bound port.

    With `ssl_context` it serves HTTPS. Stop it with `await runner.cleanup()`.
    `options` are `create_app`'s; without a `browser_policy`, that of a door
    bound to `host` with nothing more allowed.
    """
    options.setdefault("browser_policy", BrowserPolicy.for_bind(host))
    # A refused (413) body is drained for at most LINGER_S, not aiohttp's 10 s,
    # so that it cannot hold up a graceful stop.
    limits = options.get("http_limits", HttpLimits())
    runner = GuardedRunner(create_app(backend_target, **options), limits, access_log=None, lingering_time=LINGER_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    bound_port = runner.addresses[0][1]
    return runner, bound_port
