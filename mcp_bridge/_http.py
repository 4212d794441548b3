"""The door's HTTP side: the MCP SDK's streamable-HTTP session manager as an
ASGI app, served by uvicorn inside the process's event loop.

Every request passes the gate before the SDK reads a byte of it: first the
`Host` and `Origin` rule of every door (`ors_grpc.protocol.browser_policy`:
421 for a foreign `Host`, 403 for a foreign `Origin` on any request, CORS
headers for an allowed one), then the API key
(`x-api-key` or `Authorization: Bearer`) must be one the backend accepts
(HTTP 401 otherwise) and the URL's environment one it serves (404), both
asked of the backend (`ListEnvironments`, cached per key for a few seconds,
as the HTTP door's default-environment redirect does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from typing import Any, Iterator, Optional

import grpc
import uvicorn
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from ors_grpc._generated.ors.v1.environment_service_pb2_grpc import EnvironmentServiceStub
from ors_grpc.observability import tracing
from ors_grpc.protocol import door
from ors_grpc.protocol.browser_policy import (
    FOREIGN_HOST_DETAIL,
    FOREIGN_ORIGIN_DETAIL,
    BrowserPolicy,
    OriginKind,
    is_preflight,
)
from ors_grpc.protocol.constants import (
    API_KEY_HEADER,
    DEFAULT_KEEPALIVE_INTERVAL_S,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_SESSION_TIMEOUT_S,
)
from ors_grpc.protocol.errors import unknown_environment

from ._answers import JSON_WHEN_CHOSEN, serve_choosing_answers
from ._server import build_server

__all__ = ["McpDoor", "start_mcp_door"]

#: Seconds the backend's environment names (and so an accepted key) are cached.
ENV_CACHE_TTL_S = 5.0
#: Largest MCP request body (HTTP 413 above it): the SDK's 4 MiB, or the message limit if lower.
#: An agent's tool arguments are far smaller; an orchestrator sends big inputs over gRPC or HTTP.
MAX_BODY_BYTES = DEFAULT_MAX_REQUEST_BODY_SIZE
#: Seconds open requests get to finish when the door stops.
STOP_GRACE_S = 2.0
#: The SDK's own Host/Origin check is off: the gate applies the rule every door shares.
_SDK_HOST_CHECK_OFF = TransportSecuritySettings(enable_dns_rebinding_protection=False)


class _Gate:
    """Host and Origin, the API key and the environment, checked before the SDK reads the request."""

    def __init__(self, manager: StreamableHTTPSessionManager, env_names: door.EnvNames, keepalive_s: float,
                 policy: BrowserPolicy) -> None:
        self._manager = manager
        self._env_names = env_names
        self._keepalive_s = keepalive_s
        self._policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        host = headers.get("host")
        if not self._policy.host_allowed(host):
            return await _refuse(send, 421, FOREIGN_HOST_DETAIL)
        origin = headers.get("origin")
        if origin is not None:
            # MCP asks servers to check Origin on every request: a stream (GET) carries answers too.
            kind = self._policy.origin_kind(origin, host)
            if kind is OriginKind.FOREIGN:
                return await _refuse(send, 403, FOREIGN_ORIGIN_DETAIL)
            if is_preflight(scope["method"], headers):
                return await _answer_preflight(send, self._policy.preflight_headers(origin))
            if kind is OriginKind.ALLOWED:
                send = _with_headers(send, self._policy.cors_headers(origin))
        await self._checked(scope, receive, send, headers)

    async def _checked(self, scope: Scope, receive: Receive, send: Send, headers: Headers) -> None:
        metadata = door.call_metadata(headers)
        try:
            names = await self._env_names.get(metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                return await _refuse(send, 401, f"a valid API key is required ({API_KEY_HEADER} or Authorization: Bearer)")
            return await _refuse(send, 503, "ORS backend unavailable, retry shortly")
        env = scope["path_params"]["env"]
        if env.lower() not in names:
            return await _refuse(send, 404, unknown_environment(env, names))
        await serve_choosing_answers(self._manager.handle_request, scope, receive, send, self._keepalive_s)


async def _answer_preflight(send: Send, cors_headers: dict[str, str]) -> None:
    await send({"type": "http.response.start", "status": 204,
                "headers": [(name.lower().encode(), value.encode()) for name, value in cors_headers.items()]})
    await send({"type": "http.response.body", "body": b""})


def _with_headers(send: Send, extra: dict[str, str]) -> Send:
    """`send`, adding `extra` to the response's headers (in place of any of the same names)."""
    encoded = [(name.lower().encode(), value.encode()) for name, value in extra.items()]

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            names = {name for name, _ in encoded}
            kept = [(name, value) for name, value in message.get("headers", ()) if name.lower() not in names]
            message = {**message, "headers": [*kept, *encoded]}
        await send(message)

    return sending


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn inside a running loop whose owner handles SIGINT/SIGTERM (`ors_grpc.serving`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on host:port (OSError when it cannot). Made as TCP
    (`IPPROTO_TCP`) so that asyncio sets TCP_NODELAY on its connections."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _quiet_sdk_logs() -> None:
    """The SDK and uvicorn log a line per MCP session at INFO (a trainer opens hundreds a
    second): WARNING for them, unless their level was set on purpose."""
    for name in ("mcp", "uvicorn"):
        sdk_logger = logging.getLogger(name)
        if sdk_logger.level == logging.NOTSET:
            sdk_logger.setLevel(logging.WARNING)


async def _serve(manager: StreamableHTTPSessionManager, server: _EmbeddedUvicorn, sock: socket.socket) -> None:
    """The session manager's life around uvicorn's, in one task (anyio scopes end in the task that began them).
    Leaving the manager ends the MCP sessions: the episodes that convenience URLs made are deleted."""
    async with manager.run():
        await server.serve(sockets=[sock])


class McpDoor:
    """A running MCP door; `await cleanup()` stops it (as an aiohttp runner)."""

    def __init__(self, server: _EmbeddedUvicorn, serving: asyncio.Task[None], stack: contextlib.AsyncExitStack):
        self._server = server
        self._serving = serving
        self._stack = stack

    async def cleanup(self) -> None:
        self._server.should_exit = True
        try:
            await self._serving
        finally:
            await self._stack.aclose()


async def start_mcp_door(
    backend_target: str,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    channel: Any = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    session_idle_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
    keepalive_interval_s: float = DEFAULT_KEEPALIVE_INTERVAL_S,
    tls_cert: Optional[str] = None,
    tls_key: Optional[str] = None,
    tls_root_cert: Optional[str] = None,
    tls_server_name: Optional[str] = None,
    browser_policy: Optional[BrowserPolicy] = None,
) -> tuple[McpDoor, int]:
    """Serve MCP (streamable HTTP) on host:port (0: a free port) onto the gRPC
    backend at `backend_target`, or over `channel` (the in-process channel of
    `ors-grpc serve`); returns the door and its port. An MCP session idle for
    `session_idle_timeout_s` is ended; an answer that waits on a tool gets a
    `: ping` every `keepalive_interval_s` (see `_answers`). With
    `tls_cert`/`tls_key` it serves HTTPS; with `tls_root_cert` it reaches the
    backend over TLS. `browser_policy` says which `Host` and `Origin` are
    served (None: that of a door bound to `host`, with nothing more allowed)."""
    _quiet_sdk_logs()
    policy = browser_policy or BrowserPolicy.for_bind(host)
    sock = _listening_socket(host, port)
    stack = contextlib.AsyncExitStack()
    try:
        if channel is None:
            channel = door.open_channel(backend_target, max_message_bytes=max_message_bytes,
                                        tls_root_cert=tls_root_cert, tls_server_name=tls_server_name)
            stack.push_async_callback(channel.close)
        stub = EnvironmentServiceStub(tracing.propagating(channel))
        manager = StreamableHTTPSessionManager(
            app=build_server(stub), json_response=JSON_WHEN_CHOSEN, security_settings=_SDK_HOST_CHECK_OFF,
            max_request_body_size=min(MAX_BODY_BYTES, max_message_bytes), session_idle_timeout=session_idle_timeout_s,
        )
        gate = _Gate(manager, door.EnvNames(stub, ENV_CACHE_TTL_S), keepalive_interval_s, policy)
        app = Router(routes=[Route("/{env}/mcp", gate), Route("/{env}/mcp/{session_id}", gate)])
        config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False, ws="none", proxy_headers=False,
                                timeout_graceful_shutdown=STOP_GRACE_S, ssl_certfile=tls_cert, ssl_keyfile=tls_key)
        server = _EmbeddedUvicorn(config)
        serving = asyncio.get_running_loop().create_task(_serve(manager, server, sock), name="ors-mcp-door")
        while not server.started:
            if serving.done():
                serving.result()  # startup failed: its exception
                raise RuntimeError("the MCP door stopped while starting")
            await asyncio.sleep(0.005)
    except BaseException:
        sock.close()
        await stack.aclose()
        raise
    return McpDoor(server, serving, stack), sock.getsockname()[1]
