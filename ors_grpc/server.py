"""The gRPC server: the ORS service plus health, reflection, auth, TLS, limits.

`create_server` builds and starts a `grpc.aio` server hosting the given
environments. Its `stop()` also ends every session (teardown included) once
the server has stopped accepting work.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ._generated.ors.v1 import environment_service_pb2 as pb
from ._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ._generated.ors.v1 import errors_pb2
from .environment import Environment
from . import metrics
from .errors import ORSError, abort
from .inprocess import InProcessChannel
from .service import EnvironmentService, ToolsetRegistry
from .sessions import SessionTable

__all__ = ["API_KEY_METADATA_KEY", "Server", "ServerConfig", "create_server", "in_process_channel"]

API_KEY_METADATA_KEY = "x-api-key"
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EnvironmentService"].full_name
# Health checks answer without a key: grpc.health.v1, and our own Health RPC
# (HTTP /health maps onto it, and the ORS spec exempts /health).
_HEALTH_SERVICE_PREFIX = f"/{health_pb2.DESCRIPTOR.services_by_name['Health'].full_name}/"
_HEALTH_METHOD = f"/{SERVICE_NAME}/Health"


@dataclass(frozen=True)
class ServerConfig:
    """Server settings; the defaults follow the ORS spec."""

    #: Seconds without activity after which a session is reaped.
    session_timeout_s: float = 900.0
    #: Seconds between reaper sweeps.
    reaper_interval_s: float = 5.0
    #: Seconds a finished tool call stays attachable by task id.
    result_linger_s: float = 60.0
    #: Largest message sent or received, in bytes.
    max_message_bytes: int = 32 * 1024 * 1024
    #: When set, every RPC but health checks needs metadata `x-api-key`.
    api_key: str | None = None
    #: When set, creating more episodes than this fails with TOO_MANY_SESSIONS.
    max_sessions: int | None = None
    #: When set, a tool call running longer fails ("tool call timed out").
    tool_timeout_s: float | None = None
    #: PEM certificate chain and private key files: serve TLS instead of plaintext.
    tls_cert: str | None = None
    tls_key: str | None = None
    #: Seconds a session call waits for the episode's setup before failing
    #: with ENVIRONMENT_STARTING (HTTP 503), to be retried; openreward's 25 s.
    setup_wait_s: float = 25.0


class _ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without the right `x-api-key` (constant-time comparison)."""

    def __init__(self, api_key: str) -> None:
        self._api_key = api_key.encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        exempt = details.method == _HEALTH_METHOD or details.method.startswith(_HEALTH_SERVICE_PREFIX)
        if handler is None or exempt:
            return handler
        if self._authorized(details.invocation_metadata or ()):
            return handler
        return _rejecting_handler(handler)

    def _authorized(self, metadata: Sequence[tuple[str, Any]]) -> bool:
        for key, value in metadata:
            if key == API_KEY_METADATA_KEY:
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._api_key)
        return False


def _rejecting_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that fails UNAUTHENTICATED."""

    async def reject(request: Any, context: grpc.aio.ServicerContext) -> None:
        await abort(context, ORSError(errors_pb2.ERROR_REASON_UNAUTHENTICATED, "missing or invalid API key"))

    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(reject, **serializers)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(reject, **serializers)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(reject, **serializers)
    return grpc.stream_stream_rpc_method_handler(reject, **serializers)


class _Malformed:
    """Stands in for a request message whose bytes do not parse."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class _MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    """Answers INVALID_ARGUMENT to request bytes that do not parse.

    grpc itself answers UNKNOWN (and logs a traceback) when the request
    deserializer raises; a malformed request is the client's error.
    In a bidirectional RPC written as an async generator (RunEpisode) a
    malformed message ends the call the same way; other request-streaming
    handlers (reflection) are left as they are.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        if handler.request_streaming and not inspect.isasyncgenfunction(handler.stream_stream):
            return handler
        return _checking_handler(handler)


def _checking_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    deserialize = handler.request_deserializer

    def checked_deserialize(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # DecodeError, bad UTF-8 in a string field, ...
            return _Malformed(exc)

    async def refuse(context: grpc.aio.ServicerContext, request: _Malformed) -> None:
        await abort(context, ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST,
                                      f"malformed request message: {request.error}"))

    serializers = {"request_deserializer": checked_deserialize, "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Malformed):
                await refuse(context, request)
            result = handler.unary_unary(request, context)
            return await result if inspect.isawaitable(result) else result

        return grpc.unary_unary_rpc_method_handler(unary, **serializers)

    if handler.stream_stream:
        async def refusing_malformed(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            async for request in requests:
                if isinstance(request, _Malformed):
                    await refuse(context, request)
                yield request

        async def bidirectional(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            async for message in handler.stream_stream(refusing_malformed(requests, context), context):
                yield message

        return grpc.stream_stream_rpc_method_handler(bidirectional, **serializers)

    behavior = handler.unary_stream
    if inspect.isasyncgenfunction(behavior):
        async def streaming(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Malformed):
                await refuse(context, request)
            async for message in behavior(request, context):
                yield message

        return grpc.unary_stream_rpc_method_handler(streaming, **serializers)

    async def writing(request: Any, context: grpc.aio.ServicerContext) -> None:
        # A streaming handler that writes with `context.write` (grpc.health Watch).
        if isinstance(request, _Malformed):
            await refuse(context, request)
        await behavior(request, context)

    return grpc.unary_stream_rpc_method_handler(writing, **serializers)


def _server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    if not config.tls_cert and not config.tls_key:
        return None
    if not (config.tls_cert and config.tls_key):
        raise ValueError("TLS needs both a certificate and a key file")
    key = Path(config.tls_key).read_bytes()
    cert = Path(config.tls_cert).read_bytes()
    return grpc.ssl_server_credentials([(key, cert)])


async def create_server(
    environments: Sequence[type[Environment]],
    address: str = "127.0.0.1:0",
    *,
    config: ServerConfig = ServerConfig(),
    toolsets: ToolsetRegistry = (),
) -> tuple[grpc.aio.Server, int]:
    """Build and start a server for `environments` (the first is the default).

    `toolsets` (Toolset classes, registered by `name()`, or a mapping of
    names to classes) can be attached to an episode by name
    (`toolset_name`). Returns the started server and the port it listens on
    (useful with port 0). `await server.stop(grace)` stops accepting calls,
    then ends every session.
    """
    sessions = SessionTable(
        session_timeout_s=config.session_timeout_s,
        reaper_interval_s=config.reaper_interval_s,
        result_linger_s=config.result_linger_s,
        max_sessions=config.max_sessions,
        tool_timeout_s=config.tool_timeout_s,
        setup_wait_s=config.setup_wait_s,
    )
    service = EnvironmentService(environments, sessions, toolsets)
    # Metrics first: it also counts the calls the key check rejects.
    interceptors: list[grpc.aio.ServerInterceptor] = [metrics.RpcMetricsInterceptor()]
    if config.api_key:
        interceptors.append(_ApiKeyInterceptor(config.api_key))
    server = grpc.aio.server(
        # Innermost: the key check (and anything before it) sees parsed requests.
        interceptors=[*interceptors, _MalformedRequestInterceptor()],
        options=[
            ("grpc.max_send_message_length", config.max_message_bytes),
            ("grpc.max_receive_message_length", config.max_message_bytes),
        ],
    )
    pb_grpc.add_EnvironmentServiceServicer_to_server(service, server)
    # For a bridge in this process (see in_process_channel).
    server._ors_in_process_channel = InProcessChannel(  # type: ignore[attr-defined]
        service, pb_grpc.add_EnvironmentServiceServicer_to_server, interceptors
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    credentials = _server_credentials(config)
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise OSError(f"could not bind {address}")
    await server.start()
    sessions.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    _stop_also_ends_sessions(server, sessions, health_servicer)
    return server, port


def in_process_channel(server: grpc.aio.Server) -> InProcessChannel:
    """A channel to `server`'s ORS service for a client in the same event loop
    (the HTTP bridge of `ors-grpc serve --http-port`): same handlers and
    interceptors, no socket. `server` must come from `create_server`."""
    return server._ors_in_process_channel  # type: ignore[attr-defined]


def _stop_also_ends_sessions(
    server: grpc.aio.Server, sessions: SessionTable, health_servicer: Any
) -> None:
    """Wrap `server.stop` so stopping also tears every session down.

    The contract returns a plain grpc.aio.Server; wrapping its bound `stop`
    keeps that type while making shutdown complete.
    """
    grpc_stop = server.stop
    in_process = in_process_channel(server)

    async def stop(grace: float | None) -> None:
        await health_servicer.enter_graceful_shutdown()
        # Calls of the in-process channel (the embedded bridge's) get the
        # same grace as calls over the network.
        await asyncio.gather(grpc_stop(grace), in_process.drain(grace))
        await sessions.close()

    server.stop = stop  # type: ignore[method-assign]


class Server:
    """Drop-in for the reference SDK's `ors.Server`: `Server([MyEnv]).run(port=8080)`.

    `run` serves the ORS HTTP API on `port` (through the HTTP bridge, so
    existing ORS clients work unchanged) and gRPC on `grpc_port`, until
    SIGINT or SIGTERM.
    """

    def __init__(
        self,
        environments: Sequence[type[Environment]],
        return_errors: str = "exception",
        *,
        config: ServerConfig = ServerConfig(),
        toolsets: ToolsetRegistry = (),
    ) -> None:
        # Fail at construction, as the reference does, not when serving.
        from .service import environment_map, toolset_map

        environment_map(environments)
        toolset_map(toolsets)
        self.environments = list(environments)
        self.config = config
        self.toolsets = toolsets
        # Accepted for signature compatibility: errors always carry the
        # exception's message here (the reference's default).
        self.return_errors = return_errors

    def run(self, host: str = "0.0.0.0", port: int = 8080, *, grpc_port: int = 50051) -> None:
        """Serve until SIGINT/SIGTERM, then tear every session down."""
        from .cli import serve_until_signal

        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO)
        asyncio.run(serve_until_signal(self.environments, host, grpc_port, port, self.config, toolsets=self.toolsets))
