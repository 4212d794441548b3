"""Tracing of the bridge (see `ors_grpc.observability.tracing`): one SERVER span per HTTP request, continuing
the client's W3C `traceparent`, and that context sent on to the backend in the gRPC metadata.

Both are installed only while tracing is on (`install(app)` adds the
middleware, `tracing.propagating(channel)` wraps the channel); off, the bridge is unchanged.
The context travels in the metadata for both channels alike: a network
`grpc.aio` channel (`ors-grpc bridge`) and the in-process one
(`serve --http-port`), which client interceptors cannot reach.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web

from ors_grpc.observability import tracing
from ors_grpc.protocol.constants import SESSION_ID_HEADER

from ._metrics import KNOWN_METHODS, FinalStatus, route_pattern

__all__ = ["install", "trace_requests"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def install(app: web.Application) -> None:
    """While tracing is on: the tracing middleware, outermost (it sees the final statuses)."""
    if tracing.enabled():
        app.middlewares.insert(0, trace_requests)


@web.middleware
async def trace_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A SERVER span per request (HTTP semantic conventions; no headers, bodies or query)."""
    from opentelemetry.trace import SpanKind, Status, StatusCode

    if tracing.tracer is None:
        return await handler(request)
    route = route_pattern(request)
    # A method of the client's invention is not a span name (HTTP semantic conventions).
    method = request.method if request.method in KNOWN_METHODS else "_OTHER"
    attributes = {"http.request.method": method, "url.path": request.path, "url.scheme": request.scheme}
    if route is not None:
        attributes["http.route"] = route
    session_id = request.headers.get(SESSION_ID_HEADER)
    if session_id:
        attributes[tracing.SESSION_ID_ATTRIBUTE] = session_id
    with tracing.tracer.start_as_current_span(
        f"{request.method} {route}" if route else ("HTTP" if method == "_OTHER" else method),
        context=tracing.extract_context(request.headers), kind=SpanKind.SERVER, attributes=attributes,
        record_exception=False, set_status_on_exception=False,
    ) as span:
        final = FinalStatus()
        try:
            with final:
                return final.answered(await handler(request))
        finally:
            span.set_attribute("http.response.status_code", final.status)
            if final.status >= 500:
                span.set_status(Status(StatusCode.ERROR))
