"""Request counts and latency of the bridge, by route and status, for Prometheus.

The metrics go to `prometheus_client`'s default registry; `ors-grpc bridge
--metrics-port N` (or `ors-grpc serve --http-port P --metrics-port N`) serves
them at `http://HOST:N/metrics`, on a port apart from the ORS API's.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Awaitable, Callable, Optional

from aiohttp import web
from prometheus_client import Counter, Histogram

from ors_grpc.observability.metrics import DURATION_BUCKETS

__all__ = ["REQUESTS", "REQUEST_SECONDS", "record_metrics", "route_pattern", "status_of"]

#: A client that leaves before the answer (nginx's convention).
CLIENT_CLOSED_REQUEST = 499
UNMATCHED_ROUTE = "unmatched"
#: Methods labelled as themselves; any other is labelled "other", so that
#: clients cannot mint label values (each would be kept for good).
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})

REQUESTS = Counter("ors_bridge_requests", "HTTP requests answered, by route, method and status.",
                   ["route", "method", "status"])
REQUEST_SECONDS = Histogram(
    "ors_bridge_request_duration_seconds",
    "Time to answer an HTTP request, by route and method (a /call counts until its SSE stream ends).",
    ["route", "method"], buckets=DURATION_BUCKETS,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def route_pattern(request: web.Request) -> Optional[str]:
    """The route's pattern (`/{env}/call`), never the raw path: environment
    names and bogus paths must not mint label values. None when no route matched."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


def status_of(error: BaseException) -> int:
    """The status of a request whose handler raised `error`, as a middleware around it sees it:
    the HTTP exception's; CLIENT_CLOSED_REQUEST if the client left; else 500."""
    if isinstance(error, web.HTTPException):
        return error.status
    if isinstance(error, asyncio.CancelledError):
        return CLIENT_CLOSED_REQUEST  # the client left: not the server's error
    return 500


@web.middleware
async def record_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count and time every request. Installed outermost, so the statuses it
    sees are the final ones (after the error middleware and redirects)."""
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except BaseException as exc:
        status = status_of(exc)
        raise
    finally:
        method = request.method if request.method in KNOWN_METHODS else "other"
        route = route_pattern(request)
        count, seconds = _request_metrics(route if route is not None else UNMATCHED_ROUTE, method, status)
        count.inc()
        seconds.observe(time.perf_counter() - started)


@functools.lru_cache(maxsize=4096)
def _request_metrics(route: str, method: str, status: int) -> tuple[Counter, Histogram]:
    """The metric children of one label set, looked up once (`labels()` takes a lock)."""
    return REQUESTS.labels(route, method, str(status)), REQUEST_SECONDS.labels(route, method)
