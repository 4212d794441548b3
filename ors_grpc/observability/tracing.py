"""OpenTelemetry tracing of the ORS service (optional: the `otel` extra).

Off unless the standard `OTEL_*` environment (or `enable(tracer_provider)`)
asks for it, and then free: with tracing off no interceptor, middleware or
channel wrapper is installed. On, it makes one SERVER span per RPC
(continuing the call's W3C `traceparent`), `ors.setup` and `execute_tool
{name}`, never with secrets, tool input or output, and carries the context
into worker processes. A small interceptor of its own, because
opentelemetry-instrumentation-grpc's aio one breaks streaming handlers
written as coroutines and cannot read the in-process channel's metadata.
When it is on, the spans and their attributes: docs/deployment.md, "Tracing".
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import sys
import weakref
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, TypeVar

import grpc

from ors_grpc._version import __version__
from ors_grpc.extras import extra_install_command
from ors_grpc.observability.rpc_handlers import wrap_behavior
from ors_grpc.protocol.constants import SESSION_ID_METADATA_KEY

__all__ = [
    "RpcTracingInterceptor",
    "continue_trace",
    "current_carrier",
    "disable",
    "enable",
    "enabled",
    "extract_context",
    "flush",
    "inject_context",
    "propagating",
    "server_interceptors",
    "traced_setup",
    "traced_tool_call",
    "tracer",
]

logger = logging.getLogger("ors_grpc.tracing")

T = TypeVar("T")

#: The ORS tracer while tracing is on, else None (the hot path checks only this).
tracer: Any = None
#: The tracer provider behind `tracer` (flushed before a worker process ends).
_provider: Any = None
_environment_checked = False

#: The session id an RPC acts on, for the spans of work it starts (tool calls
#: run in tasks that inherit it).
SESSION_ID: contextvars.ContextVar[str] = contextvars.ContextVar("ors_session_id", default="")
#: The session of each episode (its environment_host) set up while tracing was
#: on, for its tool calls' spans: it names the session also for a RunEpisode
#: stream's calls, and after a rename. Weak both ways, so that it keeps nothing alive.
_SESSION_OF_HOST: "weakref.WeakKeyDictionary[Any, weakref.ref[Any]]" = weakref.WeakKeyDictionary()

SESSION_ID_ATTRIBUTE = "ors.session_id"
#: Status codes that are the server's fault (OpenTelemetry's gRPC convention).
_SERVER_ERRORS = frozenset({
    grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS,
})


def enable(tracer_provider: Any = None) -> None:
    """Trace from now on, with `tracer_provider` (default: the global one)."""
    global tracer, _provider
    from opentelemetry import trace

    _provider = tracer_provider or trace.get_tracer_provider()
    tracer = trace.get_tracer("ors_grpc", __version__, tracer_provider)


def disable() -> None:
    """Stop tracing (servers and bridges built while it was on keep their hooks)."""
    global tracer, _provider
    tracer = _provider = None


#: Milliseconds `flush` waits for the exporters at most.
FLUSH_TIMEOUT_MS = 5000


def flush() -> None:
    """Export the spans still buffered, while tracing is on: a process that ends with
    `os._exit` (a worker) skips the SDK's own flush at exit."""
    force_flush = getattr(_provider, "force_flush", None)
    if tracer is not None and force_flush is not None:
        force_flush(FLUSH_TIMEOUT_MS)


def enabled() -> bool:
    """Whether tracing is on; the first call turns it on if the environment asks."""
    global _environment_checked
    if not _environment_checked:
        _environment_checked = True
        if tracer is None:
            _enable_from_environment()
    return tracer is not None


# --- configuration from the OTEL_* environment ---------------------------------


def _exporter_names() -> list[str]:
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not names and (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                      or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        names = "otlp"  # opentelemetry-distro's default exporter
    return [name.strip() for name in names.split(",") if name.strip() and name.strip() != "none"]


#: OTLP exporter entry points by OTEL_EXPORTER_OTLP_PROTOCOL.
_OTLP_EXPORTERS = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}


def _otlp_exporter_name(name: str) -> str:
    """`otlp` picks its transport by OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL, as the SDK does."""
    if name != "otlp":
        return name
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip()
    if protocol not in _OTLP_EXPORTERS:
        raise ValueError(f"unsupported OTLP protocol {protocol!r} (grpc or http/protobuf)")
    return _OTLP_EXPORTERS[protocol]


def _load_exporter(name: str) -> Any:
    from importlib.metadata import entry_points

    found = list(entry_points(group="opentelemetry_traces_exporter", name=_otlp_exporter_name(name)))
    if not found:
        raise ValueError(f"no OpenTelemetry trace exporter named {name!r} is installed")
    return found[0].load()()


def _enable_from_environment() -> None:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return
    exporters = _exporter_names()
    if not exporters and "opentelemetry.trace" not in sys.modules:
        return  # nothing asks for traces, and nothing can have installed a tracer provider
    try:
        from opentelemetry import trace
    except ImportError:
        if exporters:
            _not_tracing(f"OTEL_* asks for traces but OpenTelemetry is not installed: {extra_install_command('otel')}")
        return
    installed = trace.get_tracer_provider()
    if not isinstance(installed, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        enable(installed)  # e.g. under `opentelemetry-instrument`
        return
    if not exporters:
        return
    try:
        provider = _sdk_tracer_provider(exporters)
    except ImportError:
        _not_tracing(f"OTEL_* asks for traces but the OpenTelemetry SDK is not installed: "
                     f"{extra_install_command('otel')}")
        return
    except Exception as exc:  # an unknown exporter, a bad OTLP protocol: serve, untraced
        _not_tracing(str(exc))
        return
    # Global too, so that spans of instrumented libraries in tools join the trace.
    trace.set_tracer_provider(provider)
    enable(provider)
    logger.info("tracing_enabled exporters=%s", ",".join(exporters))


def _not_tracing(reason: str) -> None:
    # Observability must not take the service down: one clear line, and serve on.
    logger.warning("tracing_disabled reason=%s", reason)


def _sdk_tracer_provider(exporters: list[str]) -> Any:
    """An SDK tracer provider exporting to `exporters` in batches. The SDK reads the rest of
    the environment: OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_BSP_*."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "ors-grpc"}))
    processors = [BatchSpanProcessor(_load_exporter(name)) for name in exporters]
    provider = TracerProvider(resource=resource)
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


# --- propagation ---------------------------------------------------------------------


def current_carrier() -> dict[str, str]:
    """The current trace context as W3C headers (`traceparent`, ...)."""
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier


def inject_context(metadata: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """`metadata` plus the current trace context (`traceparent`, ...)."""
    return (*metadata, *current_carrier().items())


def continue_trace(carrier: dict[str, str]) -> None:
    """Make the trace context of `carrier` (`current_carrier` of another process) current in
    this task: spans opened from here on are its children. Nothing to undo: a task runs in a
    copy of its creator's context, which ends with it."""
    from opentelemetry import context

    context.attach(extract_context(carrier))


def propagating(channel: Any) -> Any:
    """`channel`, sending the current trace context with every call while tracing is on (else
    `channel` itself). A door's channel: the in-process one takes no client interceptors."""
    return _PropagatingChannel(channel) if enabled() else channel


class _PropagatingChannel:
    """A channel whose calls carry the caller's trace context in their metadata."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel

    def unary_unary(self, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        return _with_trace_context(self._channel.unary_unary(*args, **kwargs))

    def unary_stream(self, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        return _with_trace_context(self._channel.unary_stream(*args, **kwargs))

    def stream_stream(self, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        return _with_trace_context(self._channel.stream_stream(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


def _with_trace_context(multicallable: Callable[..., Any]) -> Callable[..., Any]:
    def call(request: Any, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        return multicallable(request, *args, metadata=inject_context(tuple(metadata or ())), **kwargs)

    return call


def extract_context(metadata: Any) -> Any:
    """The trace context carried by gRPC metadata (or any header mapping)."""
    from opentelemetry.propagate import extract

    carrier = metadata if hasattr(metadata, "get") else {key: value for key, value in metadata or ()}
    return extract(carrier)


# --- spans of RPCs ----------------------------------------------------------------------


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """What a server adds to its interceptors: the RPC tracer when tracing is on, else nothing."""
    return [RpcTracingInterceptor()] if enabled() else []


def _session_id(request: Any, metadata: Any) -> str:
    """The session an RPC names: its request's `session_id`, else `x-session-id` metadata."""
    sid = getattr(request, "session_id", "")
    if isinstance(sid, str) and sid:
        return sid
    for key, value in metadata or ():
        if key == SESSION_ID_METADATA_KEY and isinstance(value, str):
            return value
    return ""


class RpcTracingInterceptor(grpc.aio.ServerInterceptor):
    """One SERVER span per RPC, continuing the caller's trace context. Install it first."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or tracer is None:
            return handler
        span = _RpcSpan(details)
        return wrap_behavior(handler, span.unary, span.stream)


class _RpcSpan:
    """Opens the span of one RPC around its handler."""

    def __init__(self, details: grpc.HandlerCallDetails) -> None:
        self.name = details.method.lstrip("/")
        service, _, method = self.name.rpartition("/")
        self.metadata = details.invocation_metadata or ()
        self.attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}

    def _start(self, request: Any) -> tuple[Any, Optional[contextvars.Token[str]]]:
        from opentelemetry.trace import SpanKind

        span = tracer.start_span(self.name, context=extract_context(self.metadata), kind=SpanKind.SERVER,
                                 attributes=self.attributes)
        sid = _session_id(request, self.metadata)
        if sid:
            span.set_attribute(SESSION_ID_ATTRIBUTE, sid)
        return span, (SESSION_ID.set(sid) if sid else None)

    def unary(self, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def traced(request: Any, context: grpc.aio.ServicerContext) -> Any:
            from opentelemetry.trace import use_span

            span, token = self._start(request)
            raised: Optional[BaseException] = None
            try:
                with use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                    return await behavior(request, context)
            except BaseException as exc:
                raised = exc
                raise
            finally:
                _end_rpc_span(span, context, raised)
                _reset(token)

        return traced

    def stream(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        """A server-streaming or bidirectional RPC (`request` is then the request iterator)."""

        async def traced(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            from opentelemetry.trace import use_span

            span, token = self._start(request)
            raised: Optional[BaseException] = None
            try:
                with use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                    messages = behavior(request, context)
                    if hasattr(messages, "__aiter__"):
                        async for message in messages:
                            yield message
                    else:  # a coroutine handler: writes with context.write, or only aborts
                        await messages
            except BaseException as exc:
                raised = exc
                raise
            finally:
                _end_rpc_span(span, context, raised)
                _reset(token)

        return traced


def _reset(token: Optional[contextvars.Token[str]]) -> None:
    if token is None:
        return
    try:
        SESSION_ID.reset(token)
    except ValueError:
        pass  # a stream finalized outside the task that ran it: its context is gone anyway


def _end_rpc_span(span: Any, context: grpc.aio.ServicerContext, raised: Optional[BaseException]) -> None:
    from opentelemetry.trace import Status, StatusCode

    code = context.code()
    if not isinstance(code, grpc.StatusCode):
        if raised is None:
            code = grpc.StatusCode.OK
        elif isinstance(raised, (GeneratorExit, asyncio.CancelledError)):
            code = grpc.StatusCode.CANCELLED
        else:
            code = grpc.StatusCode.UNKNOWN
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code in _SERVER_ERRORS:
        span.set_status(Status(StatusCode.ERROR, code.name))
    span.end()


# --- spans of setup and tool calls (called only while tracing is on) ------------------


async def traced_setup(session: Any, setup: Awaitable[None]) -> None:
    """Await a session's setup inside an `ors.setup` span (a child of the CreateEpisode RPC)."""
    from opentelemetry.trace import Status, StatusCode

    attributes = {"ors.environment": session.env_cls.name().lower(), SESSION_ID_ATTRIBUTE: session.sid}
    with tracer.start_as_current_span("ors.setup", attributes=attributes, record_exception=False,
                                      set_status_on_exception=False) as span:
        outcome = "cancelled"
        try:
            await setup
            outcome = "failed" if session.host.failure is not None else "ok" if session.host.set_up else "cancelled"
            if session.host.set_up:
                _remember_session(session)
        finally:
            span.set_attribute("ors.outcome", outcome)
            if outcome == "failed":
                # The message is the (secret-masked) one clients get.
                span.set_status(Status(StatusCode.ERROR, session.host.failure.message))


def _remember_session(session: Any) -> None:
    try:
        _SESSION_OF_HOST[session.host] = weakref.ref(session)
    except TypeError:
        pass  # a host that cannot be weakly referenced: the RPC's session id serves


def _session_id_of(host: Any) -> str:
    """The session of episode `host` (set up while tracing was on), else the RPC's."""
    try:
        session = _SESSION_OF_HOST.get(host, _no_session)()
    except TypeError:
        session = None
    return session.sid if session is not None else SESSION_ID.get()


def _no_session() -> None:
    return None


async def traced_tool_call(host: Any, tool: str, call: Awaitable[T]) -> T:
    """Await one tool call (a tool_calls.CallOutcome) inside an `execute_tool` span.

    `tool` is the metrics' bounded tool label (a name the environment does
    not define is `unknown`)."""
    from opentelemetry.trace import Status, StatusCode

    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "ors.environment": host.env_cls.name().lower(),
    }
    sid = _session_id_of(host)
    if sid:
        attributes[SESSION_ID_ATTRIBUTE] = sid
    with tracer.start_as_current_span(f"execute_tool {tool}", attributes=attributes, record_exception=False,
                                      set_status_on_exception=False) as span:
        outcome = "cancelled"
        try:
            result: Any = await call
            outcome = "failed" if result.result is None else "ok" if result.result.root.ok else "refused"
            return result
        finally:
            span.set_attribute("ors.outcome", outcome)
            if outcome == "failed":
                span.set_status(Status(StatusCode.ERROR))
