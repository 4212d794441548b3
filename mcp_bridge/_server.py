"""The MCP server of the door (the SDK's low-level `Server`): every request
is answered by RPCs on the gRPC stub; the door keeps no episode state.

The episode is named by the URL: `/{env}/mcp/{session_id}` serves the ORS
episode `session_id` in every protocol revision. On `/{env}/mcp?...` (the
convenience URL, handshake revisions only) `initialize` creates an episode
of the task the query names, and the end of the MCP session (DELETE, or the
SDK's idle reaper) deletes it: that episode's session id is the one thing
the MCP session holds, in the SDK's per-connection state.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Optional

import grpc
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from ors_grpc._generated.ors.v1 import environment_service_pb2 as service_pb2
from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc._generated.ors.v1.environment_service_pb2_grpc import EnvironmentServiceStub
from ors_grpc._version import __version__
from ors_grpc.observability import tracing
from ors_grpc.protocol import door, json_text
from ors_grpc.protocol.errors import http_status_for

from . import _answers as answers
from . import _convert as convert

__all__ = ["PROGRESS_INTERVAL_S", "build_server"]

logger = logging.getLogger("mcp_bridge")

#: While a tool runs, a client that gave a progress token gets a progress
#: notification this often (the seconds elapsed: ORS tools report no progress).
PROGRESS_INTERVAL_S = 2.0

_EPISODE_STATE_KEY = "ors.episode"
_CONVENIENCE_NEEDS_HANDSHAKE = (
    "this URL creates its episode when an MCP session initializes, which the 2026-07-28 revision has not: "
    "name an episode instead (/{env}/mcp/{session_id}) or use a handshake revision"
)


@dataclass(frozen=True)
class Episode:
    """The ORS episode an MCP request is about."""

    env: str
    session_id: str
    #: Created by this MCP session's `initialize` (the convenience URL), deleted at its end.
    created_here: bool = False


def _request_of(ctx: ServerRequestContext[Any, Any]) -> Any:
    if ctx.request is None:  # only streamable HTTP serves this server
        raise MCPError(code=types.INVALID_REQUEST, message="the ORS MCP door serves streamable HTTP only")
    return ctx.request


def _connection_of(ctx: ServerRequestContext[Any, Any]) -> Connection:
    """The MCP session's connection (its per-connection `state` and `exit_stack`).
    The SDK does not yet hand it to handlers publicly; its session object holds it."""
    return ctx.session._connection  # noqa: SLF001


def _rpc_error(exc: grpc.aio.AioRpcError) -> MCPError:
    """A failed RPC as a JSON-RPC error: the caller's mistakes as invalid params, the rest as internal."""
    reason = door.error_reason(exc)
    status = http_status_for(exc.code(), reason)
    message = exc.details() or exc.code().name
    if exc.code() == grpc.StatusCode.UNAVAILABLE and reason is None:
        message = "ORS backend unavailable, retry shortly"  # its details name internal addresses
    code = types.INVALID_PARAMS if 400 <= status < 500 else types.INTERNAL_ERROR
    return MCPError(code=code, message=message, data={convert.REASON_KEY: _short_reason(reason)})


def _short_reason(reason: Optional[str]) -> Optional[str]:
    """`ERROR_REASON_SESSION_NOT_FOUND` → `session_not_found`."""
    return reason.removeprefix("ERROR_REASON_").lower() if reason else None


def _bad_params(message: str) -> MCPError:
    return MCPError(code=types.INVALID_PARAMS, message=message)


def _json_param(text: str, name: str) -> Any:
    """A JSON query parameter (no NaN or Infinity: not JSON)."""
    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        return json.loads(text, parse_constant=refuse)
    except (ValueError, RecursionError):
        raise _bad_params(f"{name} must be JSON") from None


def _creation_request(env: str, query: Any, headers: Any) -> service_pb2.CreateEpisodeRequest:
    """The CreateEpisode request of a convenience URL's query (and its `X-Secrets`)."""
    try:
        secrets = door.secrets_from_header(headers.get("x-secrets"))
    except ValueError as exc:  # a lone surrogate (UnicodeEncodeError) too
        raise _bad_params(str(exc) if not isinstance(exc, UnicodeEncodeError) else "X-Secrets is not UTF-8 text")
    request = service_pb2.CreateEpisodeRequest(env_name=env, secrets=secrets)
    if "toolset" in query:
        request.toolset_name = query["toolset"]
    if "task" in query and "split" not in query and "index" not in query:
        task = _json_param(query["task"], "task")
        if not isinstance(task, dict):
            raise _bad_params("task must be a JSON object")
        request.task_spec.json = json_text.dumps(task)
    elif "split" in query and "index" in query and "task" not in query:
        try:
            index = int(query["index"])
        except ValueError:
            raise _bad_params("index must be an integer") from None
        request.task_index.CopyFrom(service_pb2.TaskIndex(split=query["split"], index=index))
    else:
        raise _bad_params("name the task: ?split=S&index=I or ?task=<JSON task spec> (optionally &toolset=NAME)")
    return request


class _Door:
    """The door's MCP handlers over one gRPC stub."""

    def __init__(self, stub: EnvironmentServiceStub) -> None:
        self._stub = stub

    # Which episode ----------------------------------------------------------

    def _episode(self, ctx: ServerRequestContext[Any, Any]) -> Episode:
        """The episode a request (after `initialize`) is about: the URL's, or the one its MCP session made."""
        params = _request_of(ctx).path_params
        env, session_id = params["env"], params.get("session_id")
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            if session_id is None:
                raise MCPError(code=types.INVALID_REQUEST, message=_CONVENIENCE_NEEDS_HANDSHAKE)
            return Episode(env, session_id)
        bound: Optional[Episode] = _connection_of(ctx).state.get(_EPISODE_STATE_KEY)
        same_url = bound is not None and bound.env == env and (
            session_id is None if bound.created_here else session_id == bound.session_id)
        if bound is None or not same_url:
            raise MCPError(code=types.INVALID_REQUEST,
                           message="this MCP session serves another episode: use the URL it was opened on")
        return bound

    def _metadata(self, ctx: ServerRequestContext[Any, Any], session_id: Optional[str] = None) -> door.Metadata:
        return door.call_metadata(_request_of(ctx).headers, session_id)

    async def _prompt_text(self, ctx: ServerRequestContext[Any, Any], episode: Episode) -> str:
        request = service_pb2.GetPromptRequest(session_id=episode.session_id)
        try:
            prompt = await self._stub.GetPrompt(request, metadata=self._metadata(ctx, episode.session_id))
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(exc) from None
        return convert.instructions(prompt)

    # The handshake ----------------------------------------------------------

    async def initialize(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Middleware: binds the MCP session to its episode (creating it on the convenience
        URL) before the SDK answers `initialize`, then puts the prompt in `instructions`."""
        if ctx.method != "initialize":
            return await call_next(ctx)
        request = _request_of(ctx)
        env, session_id = request.path_params["env"], request.path_params.get("session_id")
        connection = _connection_of(ctx)
        answers.tell_session_id(request.scope, connection.session_id)  # before the slow part: see `_answers`
        if _EPISODE_STATE_KEY in connection.state:
            raise MCPError(code=types.INVALID_REQUEST, message="this MCP session is initialized already")
        if session_id is None:
            episode = await self._create(ctx, env, connection)
        else:
            episode = Episode(env, session_id)
        instructions = await self._prompt_text(ctx, episode)
        connection.state[_EPISODE_STATE_KEY] = episode
        result = await call_next(ctx)
        if isinstance(result, dict):
            result["instructions"] = instructions
        return result

    async def _create(self, ctx: ServerRequestContext[Any, Any], env: str, connection: Connection) -> Episode:
        """The convenience URL's episode: created now, deleted when the MCP session ends."""
        request = _request_of(ctx)
        creation = _creation_request(env, request.query_params, request.headers)
        metadata = self._metadata(ctx)
        try:
            creation.session_id = (await self._stub.CreateSessionId(
                service_pb2.CreateSessionIdRequest(), metadata=metadata)).session_id
            await self._stub.CreateEpisode(creation, metadata=self._metadata(ctx, creation.session_id))
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(exc) from None
        except UnicodeEncodeError:
            raise _bad_params("the task is not UTF-8 text") from None
        episode = Episode(env, creation.session_id, created_here=True)
        connection.exit_stack.push_async_callback(self._delete, episode, self._metadata(ctx, episode.session_id))
        return episode

    async def _delete(self, episode: Episode, metadata: door.Metadata) -> None:
        try:
            await self._stub.DeleteEpisode(service_pb2.DeleteEpisodeRequest(session_id=episode.session_id),
                                           metadata=metadata)
        except grpc.aio.AioRpcError as exc:  # the backend is gone or stopping: its reaper ends the episode
            logger.warning("mcp_episode_delete_failed code=%s", exc.code().name)

    async def discover(self, ctx: ServerRequestContext[Any, Any], params: Any) -> types.DiscoverResult:
        """`server/discover` (2026-07-28): the episode's prompt as `instructions`.
        On the convenience URL: -32022 naming the handshake revisions, so clients fall back to them."""
        if _request_of(ctx).path_params.get("session_id") is None:
            raise MCPError(code=types.UNSUPPORTED_PROTOCOL_VERSION, message=_CONVENIENCE_NEEDS_HANDSHAKE,
                           data={"supported": list(HANDSHAKE_PROTOCOL_VERSIONS), "requested": ctx.protocol_version})
        episode = self._episode(ctx)
        return types.DiscoverResult(
            supported_versions=list(MODERN_PROTOCOL_VERSIONS),
            capabilities=self.server.get_capabilities(protocol_version=ctx.protocol_version),
            instructions=await self._prompt_text(ctx, episode),
        )

    # Tools ------------------------------------------------------------------

    async def list_tools(self, ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListToolsResult:
        episode = self._episode(ctx)
        request = service_pb2.ListTaskToolsRequest(session_id=episode.session_id)
        try:
            listing = await self._stub.ListTaskTools(request, metadata=self._metadata(ctx, episode.session_id))
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(exc) from None
        return types.ListToolsResult(tools=convert.tools(listing))

    async def call_tool(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> Any:
        """`tools/call` → CallTool. A client's cancellation stops the watching, never the tool."""
        episode = self._episode(ctx)
        call = types_pb2.ToolCall(name=params.name)
        try:
            call.input.json = json_text.dumps(params.arguments or {})
        except UnicodeEncodeError:
            raise _bad_params("tool arguments are not UTF-8 text (a lone surrogate)") from None
        stream = self._stub.CallTool(service_pb2.CallToolRequest(session_id=episode.session_id, call=call),
                                     metadata=self._metadata(ctx, episode.session_id))
        try:
            first = await stream.read()
            if first is grpc.aio.EOF or first.WhichOneof("event") != "task_id":
                return convert.failed_call("the ORS backend ended the call without a task id")
            outcome = await self._with_progress(ctx, stream)
        except grpc.aio.AioRpcError as exc:
            reason = _short_reason(door.error_reason(exc)) or exc.code().name.lower()
            return convert.refused_call(_rpc_error(exc).error.message, reason)
        finally:
            stream.cancel()  # ends our watching only: the backend never cancels a tool with its stream
        if outcome is grpc.aio.EOF:
            return convert.failed_call("the ORS backend ended the call without a result")
        if outcome.WhichOneof("event") == "result":
            return convert.tool_result(outcome.result)
        return convert.failed_call(outcome.failure.message)

    async def _with_progress(self, ctx: ServerRequestContext[Any, Any], stream: Any) -> Any:
        """The stream's next message; meanwhile, if the client gave a progress token, notify the seconds elapsed."""
        if (ctx.meta or {}).get("progress_token") is None:
            return await stream.read()
        outcome = asyncio.ensure_future(stream.read())
        try:
            elapsed = 0.0
            while True:
                done, _ = await asyncio.wait({outcome}, timeout=PROGRESS_INTERVAL_S)
                if done:
                    return outcome.result()
                elapsed += PROGRESS_INTERVAL_S
                await ctx.session.report_progress(elapsed, None, "the tool is running")
        finally:
            outcome.cancel()

    # The prompt -------------------------------------------------------------

    async def list_prompts(self, ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListPromptsResult:
        self._episode(ctx)
        return types.ListPromptsResult(prompts=[types.Prompt(
            name=convert.TASK_PROMPT, description="The episode's task: its messages, as the environment gives them.")])

    async def get_prompt(self, ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams) -> Any:
        episode = self._episode(ctx)
        if params.name != convert.TASK_PROMPT:
            raise _bad_params(f"unknown prompt; this door offers one: {convert.TASK_PROMPT!r}")
        request = service_pb2.GetMessagesRequest(session_id=episode.session_id)
        try:
            response = await self._stub.GetMessages(request, metadata=self._metadata(ctx, episode.session_id))
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(exc) from None
        return types.GetPromptResult(description="The episode's task",
                                     messages=convert.prompt_messages(response.messages))

    server: Server[Any]


def build_server(stub: EnvironmentServiceStub) -> Server[Any]:
    """The door's MCP server: tools, the `task` prompt, the prompt as `instructions`."""
    handlers = _Door(stub)
    server: Server[Any] = Server(
        "ors-grpc", version=__version__,
        on_list_tools=handlers.list_tools, on_call_tool=handlers.call_tool,
        on_list_prompts=handlers.list_prompts, on_get_prompt=handlers.get_prompt,
    )
    handlers.server = server
    if not tracing.enabled():  # the SDK's own OpenTelemetry middleware: spans only while ORS tracing is on
        server.middleware.clear()
    server.middleware.append(handlers.initialize)
    server.add_request_handler("server/discover", types.RequestParams, handlers.discover)
    return server
