"""Request counts and latency of the bridge, by route and status, for Prometheus.

The metrics go to `prometheus_client`'s default registry; `ors-grpc bridge
--metrics-port N` (or `ors-grpc serve --http-port P --metrics-port N`) serves
them at `http://HOST:N/metrics`, on a port apart from the ORS API's.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from typing import Any, Awaitable, Callable, Iterator, Optional

from aiohttp import web
from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from ors_grpc.observability.metrics import DURATION_BUCKETS

__all__ = ["REQUEST_METRICS", "FinalStatus", "RequestMetrics", "record_metrics", "route_pattern"]

#: A client that leaves before the answer (nginx's convention).
CLIENT_CLOSED_REQUEST = 499
UNMATCHED_ROUTE = "unmatched"
#: Methods labelled as themselves; any other is labelled "other", so that
#: clients cannot mint label values (each would be kept for good).
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})

REQUESTS_NAME, REQUESTS_HELP = "ors_bridge_requests", "HTTP requests answered, by route, method and status."
REQUEST_SECONDS_NAME = "ors_bridge_request_duration_seconds"
REQUEST_SECONDS_HELP = ("Time to answer an HTTP request, by route and method (a /call counts until its SSE "
                        "stream ends).")


class _Durations:
    """One route and method's request durations: a histogram's counts."""

    __slots__ = ("buckets", "total", "created")

    def __init__(self, bucket_count: int) -> None:
        self.buckets = [0] * bucket_count  # per bucket, not cumulative; the last one is +Inf's
        self.total = 0.0
        self.created = time.time()


class RequestMetrics(Collector):
    """`ors_bridge_requests` (a counter by route, method and status) and
    `ors_bridge_request_duration_seconds` (a histogram by route and method),
    exposed as prometheus_client's own Counter and Histogram would expose
    them. Counted in plain numbers by the event loop's thread, which answers
    every request: prometheus_client's objects take a lock and run a Python
    loop per update, a tenth of what the bridge itself spends on a request."""

    def __init__(self, buckets: tuple[float, ...] = DURATION_BUCKETS) -> None:
        self._bounds = tuple(buckets)
        self._requests: dict[tuple[str, str, str], list[float]] = {}  # labels -> [count, created]
        self._durations: dict[tuple[str, str], _Durations] = {}

    def record(self, route: str, method: str, status: int, seconds: float) -> None:
        counted = self._requests.get((route, method, str(status)))
        if counted is None:
            counted = self._requests[(route, method, str(status))] = [0, time.time()]
        counted[0] += 1
        durations = self._durations.get((route, method))
        if durations is None:
            durations = self._durations[(route, method)] = _Durations(len(self._bounds) + 1)
        durations.buckets[bisect.bisect_left(self._bounds, seconds)] += 1  # (a bucket holds values <= its bound)
        durations.total += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(REQUESTS_NAME, REQUESTS_HELP, labels=("route", "method", "status"))
        for labels, (count, created) in list(self._requests.items()):
            requests.add_metric(labels, count, created=created)
        yield requests
        seconds = HistogramMetricFamily(REQUEST_SECONDS_NAME, REQUEST_SECONDS_HELP, labels=("route", "method"))
        bounds = [*map(floatToGoString, self._bounds), "+Inf"]
        for labels, durations in list(self._durations.items()):
            cumulative, running = [], 0
            for bound, count in zip(bounds, durations.buckets):
                running += count
                cumulative.append((bound, running))
            seconds.add_metric(labels, cumulative, durations.total)
            seconds.samples.append(Sample(f"{REQUEST_SECONDS_NAME}_created", dict(zip(("route", "method"), labels)),
                                          durations.created))
        yield seconds

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(REQUESTS_NAME, REQUESTS_HELP, labels=("route", "method", "status"))
        yield HistogramMetricFamily(REQUEST_SECONDS_NAME, REQUEST_SECONDS_HELP, labels=("route", "method"))


REQUEST_METRICS = RequestMetrics()
REGISTRY.register(REQUEST_METRICS)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def route_pattern(request: web.Request) -> Optional[str]:
    """The route's pattern (`/{env}/call`), never the raw path: environment
    names and bogus paths must not mint label values. None when no route matched."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


class FinalStatus:
    """The status a request is answered with, as a middleware around its handler sees it
    (`with` around the handler's await, `answered` with what it returned): the response's,
    the HTTP exception's, CLIENT_CLOSED_REQUEST if the client left, else 500."""

    __slots__ = ("status",)

    def __init__(self) -> None:
        self.status = 500

    def __enter__(self) -> "FinalStatus":
        return self

    def __exit__(self, kind: Any, error: Optional[BaseException], traceback: Any) -> bool:
        if isinstance(error, web.HTTPException):
            self.status = error.status
        elif isinstance(error, asyncio.CancelledError):
            self.status = CLIENT_CLOSED_REQUEST  # the client left: not the server's error
        return False

    def answered(self, response: web.StreamResponse) -> web.StreamResponse:
        self.status = response.status
        return response


@web.middleware
async def record_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count and time every request. Installed outermost, so the statuses it
    sees are the final ones (after the error middleware and redirects)."""
    started = time.perf_counter()
    final = FinalStatus()
    try:
        with final:
            return final.answered(await handler(request))
    finally:
        method = request.method if request.method in KNOWN_METHODS else "other"
        route = route_pattern(request)
        REQUEST_METRICS.record(route if route is not None else UNMATCHED_ROUTE, method, final.status,
                               time.perf_counter() - started)
