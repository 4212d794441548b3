"""The gRPC server: the ORS service plus health, reflection, auth, TLS, limits.

`create_server` builds and starts a `grpc.aio` server hosting the given
environments and returns it as a `RunningServer`, whose `stop()` also ends
every session (teardown included) once the server has stopped accepting work.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import hmac
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc.authoring.environment import Environment
from ors_grpc.observability import metrics
from ors_grpc.observability import tracing
from ors_grpc.protocol.errors import ORSError, abort
from ors_grpc.protocol.routed_ids import door_address
from ors_grpc._runtime.drain import Drain
from ors_grpc._runtime.reflection import add_reflection
from ors_grpc._runtime.inprocess import InProcessChannel
from ors_grpc._runtime.environment_host import HostFactory
from ors_grpc._runtime.local_hosts import LocalHosts
from ors_grpc._runtime.loop_monitor import monitor_loop
from ors_grpc._runtime.service import EnvironmentService, ToolsetRegistry, environment_map, toolset_map
from ors_grpc._runtime.sessions import SessionTable
from ors_grpc._runtime.workers.hosts import WorkerHosts
from ors_grpc._runtime.workers.watchdog import DEFAULT_STALL_LIMIT_S
from ors_grpc.protocol.constants import (
    API_KEY_METADATA_KEY,
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_RESULT_LINGER_S,
    DEFAULT_SESSION_TIMEOUT_S,
    DEFAULT_SETUP_WAIT_S,
    DEFAULT_WARM_SETUP_TIMEOUT_S,
    DEFAULT_WARM_TTL_S,
)

__all__ = ["RunningServer", "ServerConfig", "create_server"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EnvironmentService"].full_name
# Health checks answer without a key: grpc.health.v1, and our own Health RPC
# (HTTP /health maps onto it, and the ORS spec exempts /health).
_HEALTH_SERVICE_PREFIX = f"/{health_pb2.DESCRIPTOR.services_by_name['Health'].full_name}/"
_HEALTH_METHOD = f"/{SERVICE_NAME}/Health"

#: grpc core's limits on calls that arrived but that the application has not
#: picked up yet. Its defaults (1,000 soft, 3,000 hard, 30 s) cancel part of
#: a burst of new calls (3,000 RunEpisode streams opened at once lost 500 to
#: 600, as CANCELLED or "Internal error from Core") while the one event loop
#: catches up; a waiting call costs a few kilobytes, so wait for the loop.
BURST_OPTIONS = [
    ("grpc.server.max_pending_requests", 100_000),
    ("grpc.server.max_pending_requests_hard_limit", 200_000),
    ("grpc.server_max_unrequested_time_in_server", 300),
    ("grpc.max_concurrent_streams", 100_000),
]


@dataclass(frozen=True)
class ServerConfig:
    """Server settings; the defaults follow the ORS spec."""

    #: Seconds without activity after which a session is reaped.
    session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S
    #: Seconds between reaper sweeps.
    reaper_interval_s: float = 5.0
    #: Seconds a finished tool call stays attachable by task id.
    result_linger_s: float = DEFAULT_RESULT_LINGER_S
    #: Largest message sent or received, in bytes.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: When set, every RPC but health checks needs metadata `x-api-key`.
    api_key: str | None = None
    #: When set, creating more episodes than this fails with TOO_MANY_SESSIONS.
    max_sessions: int | None = None
    #: When set, a tool call running longer fails ("tool call timed out").
    tool_timeout_s: float | None = None
    #: Seconds an episode prepared ahead (PrepareEpisodes) is held unclaimed
    #: once its setup ended, before it is torn down.
    warm_ttl_s: float = DEFAULT_WARM_TTL_S
    #: Seconds a prepared episode's setup may take, from its PrepareEpisodes,
    #: before it is cancelled and torn down (its place in `max_sessions` freed).
    warm_setup_timeout_s: float = DEFAULT_WARM_SETUP_TIMEOUT_S
    #: PEM certificate chain and private key files: serve TLS instead of plaintext.
    tls_cert: str | None = None
    tls_key: str | None = None
    #: Seconds a session call waits for the episode's setup before failing
    #: with ENVIRONMENT_STARTING (HTTP 503), to be retried.
    setup_wait_s: float = DEFAULT_SETUP_WAIT_S
    #: Seconds a draining server serves the episodes it holds before ending them.
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    #: When set, the session ids the server hands out name this host and the
    #: door's port (`ors_grpc.protocol.routed_ids`), for a proxy that routes
    #: each session to the backend that issued its id (Envoy's stateful sessions).
    advertise_host: str | None = None
    #: How many worker processes run environments' code (`_runtime/workers`);
    #: 0: none, it runs in the server process. None: the default of the entry
    #: point: `create_server`, which runs inside its caller's event loop (tests,
    #: embedding), hosts in-process; `ors-grpc serve`, `serving.serve` and
    #: `Server.run`, which own their process, one per CPU (docs/deployment.md).
    workers: int | None = None
    #: With `workers`: a worker whose resident memory (RSS) passes this many
    #: MiB is killed and replaced, its episodes lost (None: no limit).
    worker_memory_limit_mib: float | None = None
    #: With `workers` or `isolation`: a worker whose event loop one callback
    #: holds this many seconds (measured in the worker, off its loop), or that
    #: sends no heartbeat for as long, is killed and replaced, its episodes
    #: lost (0: never). Load does not reach it (docs/workers.md).
    worker_stall_limit_s: float = DEFAULT_STALL_LIMIT_S
    #: "episode": every episode in a process of its own, ended with it, from
    #: a pool of `workers` (default 2) started processes (None: episodes share workers).
    isolation: str | None = None
    #: `Host` values the HTTP and MCP doors serve beyond loopback's (NAME,
    #: NAME:PORT or NAME:*; see `ors_grpc.protocol.browser_policy`).
    allowed_hosts: tuple[str, ...] = ()
    #: Origins of web pages served elsewhere that may use those doors
    #: (SCHEME://NAME[:PORT] or SCHEME://NAME:*); they get CORS answers.
    allowed_origins: tuple[str, ...] = ()


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
    """Stands in for a request message whose bytes do not parse.

    Holds the error's text only: the exception's traceback holds the frame
    that holds the request bytes (up to the message limit), in a cycle that
    only a full garbage collection would free.
    """

    def __init__(self, error: str) -> None:
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


@functools.lru_cache(maxsize=256)  # made once per method's handler, not once per call
def _checking_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    deserialize = handler.request_deserializer

    def checked_deserialize(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # DecodeError, bad UTF-8 in a string field, ...
            error = str(exc)
        # Out of the except block: the exception and its traceback are freed
        # here, and `data` with the frame when this returns.
        return _Malformed(error)

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

        def bidirectional(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            # The handler's own generator, not one more async generator around it (a hop per message):
            # the RPC metrics interceptor, always outside this one, is the generator function grpc drives.
            return handler.stream_stream(refusing_malformed(requests, context), context)

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


def _availability_changed(health_servicer: Any, available: bool) -> None:
    """Health follows the workers: NOT_SERVING while none is up (a crash loop), SERVING again after.
    (A drain's graceful shutdown makes later changes no-ops.)"""
    status = health_pb2.HealthCheckResponse.SERVING if available else health_pb2.HealthCheckResponse.NOT_SERVING

    async def set_both() -> None:
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, status)

    task = asyncio.get_running_loop().create_task(set_both(), name="ors-health")
    _HEALTH_UPDATES.add(task)
    task.add_done_callback(_HEALTH_UPDATES.discard)


_HEALTH_UPDATES: set[asyncio.Task[None]] = set()


def _hosts_for(environments: Sequence[type[Environment]], toolsets: ToolsetRegistry, config: ServerConfig) -> HostFactory:
    """Where environments' code runs: in this process (`workers` 0 or None), or in `config.workers` worker processes."""
    if config.isolation == "episode":
        return WorkerHosts(config.workers or 2, environment_map(environments), toolset_map(toolsets),
                           per_episode=True, memory_limit_mib=config.worker_memory_limit_mib,
                           stall_limit_s=config.worker_stall_limit_s)
    if not config.workers:
        return LocalHosts()
    return WorkerHosts(config.workers, environment_map(environments), toolset_map(toolsets),
                       memory_limit_mib=config.worker_memory_limit_mib, stall_limit_s=config.worker_stall_limit_s)


async def create_server(
    environments: Sequence[type[Environment]],
    address: str = "127.0.0.1:0",
    *,
    config: ServerConfig = ServerConfig(),
    toolsets: ToolsetRegistry = (),
) -> tuple[RunningServer, int]:
    """Build and start a server for `environments` (the first is the default).

    `toolsets` (Toolset classes, registered by `name()`, or a mapping of
    names to classes) can be attached to an episode by name
    (`toolset_name`). Returns the started server and the port it listens on
    (useful with port 0). `await server.stop(grace)` stops accepting calls,
    then ends every session.
    """
    hosts = _hosts_for(environments, toolsets, config)
    await hosts.start()
    try:
        return await _create_server(environments, address, config, toolsets, hosts)
    except BaseException:
        await hosts.close()
        raise


async def _create_server(
    environments: Sequence[type[Environment]], address: str, config: ServerConfig, toolsets: ToolsetRegistry,
    hosts: HostFactory,
) -> tuple[RunningServer, int]:
    sessions = SessionTable(
        session_timeout_s=config.session_timeout_s,
        reaper_interval_s=config.reaper_interval_s,
        result_linger_s=config.result_linger_s,
        max_sessions=config.max_sessions,
        tool_timeout_s=config.tool_timeout_s,
        warm_ttl_s=config.warm_ttl_s,
        setup_wait_s=config.setup_wait_s,
        warm_setup_timeout_s=config.warm_setup_timeout_s,
        hosts=hosts,
    )
    metrics.track_session_load(sessions.load)
    health_servicer = health.aio.HealthServicer()
    drain = Drain(sessions, health_servicer, config.drain_timeout_s)
    service = EnvironmentService(environments, sessions, toolsets, drain=drain,
                                 max_message_bytes=config.max_message_bytes)
    # Metrics first: it also counts the calls the key check rejects.
    interceptors: list[grpc.aio.ServerInterceptor] = [metrics.RpcMetricsInterceptor()]
    interceptors[:0] = tracing.server_interceptors()  # when on, before all: its span covers the whole call
    if config.api_key:
        interceptors.append(_ApiKeyInterceptor(config.api_key))
    server = grpc.aio.server(
        # Innermost: the key check (and anything before it) sees parsed requests. Never outermost: the
        # metrics' wrapper makes its bidirectional behavior (a plain function) the async generator grpc needs.
        interceptors=[*interceptors, _MalformedRequestInterceptor()],
        options=[
            ("grpc.max_send_message_length", config.max_message_bytes),
            ("grpc.max_receive_message_length", config.max_message_bytes),
            *BURST_OPTIONS,
            # A port another process listens on is an error, not shared.
            ("grpc.so_reuseport", 0),
        ],
    )
    pb_grpc.add_EnvironmentServiceServicer_to_server(service, server)
    in_process = InProcessChannel(
        service, pb_grpc.add_EnvironmentServiceServicer_to_server, interceptors,
        max_message_bytes=config.max_message_bytes,
    )
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    add_reflection([SERVICE_NAME, health.SERVICE_NAME], server)
    credentials = _server_credentials(config)
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError:  # grpc's "Failed to bind to address ...; set GRPC_VERBOSITY=debug"
        port = 0
    if port == 0:
        raise OSError(errno.EADDRINUSE, "address in use, or not an address of this host", address)
    if config.advertise_host:
        service.route_address = door_address(config.advertise_host, port)
    await server.start()
    sessions.start()
    # In-process, environments' code shares this loop: name the code that blocks it.
    stop_loop_monitor = monitor_loop(asyncio.get_running_loop())
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    hosts.watch_availability(functools.partial(_availability_changed, health_servicer))
    return RunningServer(server, sessions, health_servicer, in_process, drain, stop_loop_monitor), port


class RunningServer:
    """A started server: the grpc.aio server, the session table it serves, its
    health service and the in-process channel onto it.

    `stop(grace)` stops accepting calls and also tears every session down.
    """

    def __init__(
        self, grpc_server: grpc.aio.Server, sessions: SessionTable, health_servicer: Any,
        in_process_channel: InProcessChannel, drain: Drain, stop_loop_monitor: Callable[[], None] = lambda: None,
    ) -> None:
        self.grpc_server = grpc_server
        self.sessions = sessions
        self.health = health_servicer
        #: A channel onto the ORS service for a client in the same event loop
        #: (the doors of `ors-grpc serve`): the same handlers and
        #: interceptors, no socket.
        self.in_process_channel = in_process_channel
        #: Its drain (`drain.begin()`, then `await drain.until_done()`, then `stop`).
        self.drain = drain
        self._stop_loop_monitor = stop_loop_monitor

    async def stop(self, grace: float | None) -> None:
        await self.health.enter_graceful_shutdown()
        # Calls of the in-process channel (the embedded doors') get the same
        # grace as calls over the network.
        await asyncio.gather(self.grpc_server.stop(grace), self.in_process_channel.drain(grace))
        await self.sessions.close()
        await self.sessions.hosts.close()
        self._stop_loop_monitor()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        return await self.grpc_server.wait_for_termination(timeout)
