"""Prometheus metrics of the ORS service, and the small HTTP server that exposes them.

One set of metrics per process, in `prometheus_client`'s default registry (the
Python client's convention): `ors-grpc serve --metrics-port N` and
`ors-grpc bridge --metrics-port N` serve it at `http://HOST:N/metrics`. The
bridge's own metrics (`ors_bridge_*`, in `http_bridge._metrics`) land in the
same registry, so `serve --http-port --metrics-port` exposes both. With
worker processes (`--workers N`, `--isolation episode`) the server's registry
also reads its workers at each scrape (`track_workers`); the workers
themselves expose nothing.

Label values are bounded: environment names are registered class names, tool
names are only those the environment defines (anything else is `unknown`),
methods are RPC names, codes are gRPC status names, crash causes are
`CRASH_CAUSES`, worker ids are those of live workers. Session ids are never a
label: there can be millions.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import inspect
import math
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, NamedTuple, Optional

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from ors_grpc.authoring.environment import tool_marks
from ors_grpc.observability import tracing
from ors_grpc.observability.rpc_handlers import wrap_behavior
from ors_grpc.protocol.errors import CRASH_CAUSES

__all__ = [
    "OPEN_SESSIONS",
    "RPCS_HANDLED",
    "SESSIONS_CREATED",
    "SESSIONS_REAPED",
    "SESSION_LOAD",
    "SETUP_SECONDS",
    "TOOL_CALLS",
    "TOOL_CALLS_IN_FLIGHT",
    "TOOL_CALL_SECONDS",
    "WARM_EPISODES",
    "WARM_EPISODES_ENDED",
    "WORKER_RESTARTS",
    "RpcMetricsInterceptor",
    "ToolCallSeries",
    "WorkerReading",
    "call_outcome",
    "session_closed",
    "session_opened",
    "start_metrics_server",
    "timed_setup",
    "track_session_load",
    "tool_call_series",
    "track_workers",
    "warm_episode_ended",
    "warm_episode_prepared",
    "worker_died",
]

if TYPE_CHECKING:  # aiohttp is imported only to serve /metrics
    from aiohttp import web

#: Tool calls and setups range from microseconds to many minutes (a sandbox
#: boot, a long compile), hence buckets past the library's 10 s default.
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
)
UNKNOWN_TOOL = "unknown"
TOOL_CALL_OUTCOMES = ("ok", "refused", "failed", "cancelled")

OPEN_SESSIONS = Gauge("ors_open_sessions", "Sessions (episodes) held by this process.")
SESSIONS_CREATED = Counter("ors_sessions_created", "Episodes created in this process.", ["environment"])
SESSIONS_REAPED = Counter("ors_sessions_reaped", "Idle sessions removed by the reaper.")
SETUP_SECONDS = Histogram(
    "ors_setup_duration_seconds", "Environment construction plus setup(), by outcome (ok, failed, cancelled).",
    ["environment", "outcome"], buckets=DURATION_BUCKETS,
)
#: Tool calls' metrics: (name, help), served by `_ToolCallMetrics` (a collector, see there).
TOOL_CALLS_IN_FLIGHT = ("ors_tool_calls_in_flight", "Tool calls running now.")
TOOL_CALL_SECONDS = ("ors_tool_call_duration_seconds", "Tool call run time.")
TOOL_CALLS = (
    "ors_tool_calls",
    "Tool calls run, by outcome: ok, refused (a tool-level error such as bad input), failed (the tool raised"
    " or timed out), cancelled (its session ended).",
)
WARM_EPISODES = Gauge(
    "ors_warm_episodes", "Episodes prepared ahead (PrepareEpisodes) and not yet claimed, set up or setting up.",
    ["environment"],
)
WARM_EPISODES_ENDED = Counter(
    "ors_warm_episodes_ended",
    "Prepared episodes that left the pool, by outcome: claimed (by an episode creation), expired (torn down"
    " unclaimed after the warm TTL), setup_timeout (setup cancelled after the warm setup timeout), cancelled"
    " (by CancelPreparedEpisodes), closed (torn down when the server stopped).",
    ["environment", "outcome"],
)
SESSION_LOAD = Gauge(
    "ors_session_load",
    "Sessions held (open plus warm) over --max-sessions: 1 is full. The autoscaling signal"
    " (deploy/k8s/hpa.yaml); NaN without --max-sessions.",
)
RPCS_HANDLED = Counter(
    "ors_grpc_handled", "RPCs completed, by method and gRPC status code (errors: code != OK).", ["method", "code"],
)
WORKER_RESTARTS = Counter(
    "ors_worker_restarts",
    "Worker processes that ended unplanned and were replaced, by cause (the `cause` episodes that lived there"
    " are answered with, ERROR_REASON_ENVIRONMENT_CRASHED's).",
    ["cause"],
)


def environment_label(env_cls: type) -> str:
    return env_cls.name().lower()


def tool_label(env: Any, name: str) -> str:
    """`name` if the environment (or one of its toolsets) defines that tool,
    else `unknown`: a client-chosen name must not mint label values."""
    return name if tool_marks(env, name) is not None else UNKNOWN_TOOL


# --- hooks called by the session table and the tool calls ---------------------


@functools.lru_cache(maxsize=None)  # environments are registered classes: `labels()` costs more than the update
def _sessions_created(env_cls: type) -> Any:
    return SESSIONS_CREATED.labels(environment_label(env_cls))


@functools.lru_cache(maxsize=None)
def _setup_seconds(env_cls: type, outcome: str) -> Any:
    return SETUP_SECONDS.labels(environment_label(env_cls), outcome)


def session_opened(env_cls: type) -> None:
    OPEN_SESSIONS.inc()
    _sessions_created(env_cls).inc()


def session_closed() -> None:
    OPEN_SESSIONS.dec()


def track_session_load(load: Callable[[], float]) -> None:
    """`ors_session_load` reads `load()` at every scrape (the process's session table)."""
    SESSION_LOAD.set_function(load)


def warm_episode_prepared(env_cls: type) -> None:
    WARM_EPISODES.labels(environment_label(env_cls)).inc()


def warm_episode_ended(env_cls: type, outcome: str) -> None:
    WARM_EPISODES.labels(environment_label(env_cls)).dec()
    WARM_EPISODES_ENDED.labels(environment_label(env_cls), outcome).inc()


async def timed_setup(session: Any, setup: Awaitable[None]) -> None:
    """Await a session's setup, observing its duration and outcome."""
    if tracing.tracer is not None:
        setup = tracing.traced_setup(session, setup)
    started = time.perf_counter()
    outcome = "cancelled"
    try:
        await setup
        outcome = "failed" if session.host.failure is not None else "ok" if session.host.set_up else "cancelled"
    finally:
        _setup_seconds(session.env_cls, outcome).observe(time.perf_counter() - started)


def call_outcome(outcome: Any) -> str:
    """The `outcome` label of a finished tool call (a tool_calls.CallOutcome)."""
    if outcome.result is None:
        return "failed"
    return "ok" if outcome.result.root.ok else "refused"


class ToolCallSeries:
    """The tool call series of one environment and tool (its label values):
    plain numbers, updated on the event loop by `start` and `end`, read at
    each scrape by `_ToolCallMetrics`."""

    __slots__ = ("environment", "tool", "in_flight", "buckets", "seconds", "outcomes", "created")

    def __init__(self, environment: str, tool: str, in_flight: list[int]) -> None:
        self.environment = environment
        self.tool = tool
        #: The environment's calls in flight (one counter shared by its tools' series).
        self.in_flight = in_flight
        #: Calls by the first bucket bound their duration is within (the last: +Inf), and their total seconds.
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)
        self.seconds = 0.0
        self.outcomes = dict.fromkeys(TOOL_CALL_OUTCOMES, 0)
        self.created = time.time()

    def start(self) -> float:
        """A call starts: counted in flight; returns its start time (for `end`)."""
        self.in_flight[0] += 1
        return time.perf_counter()

    def end(self, started: float, outcome: str) -> None:
        """A call that `start` returned `started` for ended with `outcome` (TOOL_CALL_OUTCOMES)."""
        self.in_flight[0] -= 1
        self.observe(time.perf_counter() - started, outcome)

    def observe(self, seconds: float, outcome: str) -> None:
        """A call (never in flight) that took `seconds`, with `outcome`."""
        self.seconds += seconds
        self.buckets[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
        self.outcomes[outcome] += 1


class _ToolCallMetrics:
    """`ors_tool_calls_in_flight`, `ors_tool_call_duration_seconds` and
    `ors_tool_calls`, exposed as prometheus-client's Gauge, Histogram and
    Counter would expose them, from `ToolCallSeries` (a Collector): a tool
    call updates five numbers in place rather than five metric children,
    each behind a lock and a few calls (a tenth of a trivial call's cost)."""

    def __init__(self) -> None:
        #: Series by (environment, tool) label values, and each environment's in-flight counter.
        self.series: dict[tuple[str, str], ToolCallSeries] = {}
        self.in_flight: dict[str, list[int]] = {}

    def of(self, environment: str, tool: str) -> ToolCallSeries:
        series = self.series.get((environment, tool))
        if series is None:
            in_flight = self.in_flight.setdefault(environment, [0])
            series = self.series[environment, tool] = ToolCallSeries(environment, tool, in_flight)
        return series

    def describe(self) -> list[Any]:
        return self._families()

    def collect(self) -> list[Any]:
        in_flight, seconds, calls = families = self._families()
        for environment, count in list(self.in_flight.items()):
            in_flight.add_metric([environment], count[0])
        created = prometheus_metrics._use_created
        for series in list(self.series.values()):
            labels = [series.environment, series.tool]
            cumulative, buckets = 0, []
            for bound, count in zip(_BUCKET_NAMES, series.buckets):
                cumulative += count
                buckets.append((bound, cumulative))
            seconds.add_metric(labels, buckets, series.seconds)
            if created:
                seconds.samples.append(Sample(f"{seconds.name}_created", dict(zip(("environment", "tool"), labels)),
                                              series.created, None))
            for outcome, count in series.outcomes.items():
                calls.add_metric([*labels, outcome], count, created=series.created if created else None)
        return families

    @staticmethod
    def _families() -> list[Any]:
        return [
            GaugeMetricFamily(*TOOL_CALLS_IN_FLIGHT, labels=["environment"]),
            HistogramMetricFamily(*TOOL_CALL_SECONDS, labels=["environment", "tool"]),
            CounterMetricFamily(*TOOL_CALLS, labels=["environment", "tool", "outcome"]),
        ]


#: The `le` label values of the buckets, as prometheus-client writes them.
_BUCKET_NAMES = [floatToGoString(bound) for bound in (*DURATION_BUCKETS, math.inf)]
_tool_call_metrics = _ToolCallMetrics()
REGISTRY.register(_tool_call_metrics)


@functools.lru_cache(maxsize=4096)
def tool_call_series(env_cls: type, name: str) -> ToolCallSeries:
    """The series a call of tool `name` of an episode of `env_cls` counts in
    (a name the environment does not define counts as `unknown`)."""
    return _tool_call_metrics.of(environment_label(env_cls), tool_label(env_cls, name))


# --- worker processes ----------------------------------------------------------------


class WorkerReading(NamedTuple):
    """One live worker process, read at a scrape."""

    worker_id: int
    episodes: int
    #: Its resident memory; None where it cannot be read.
    rss_bytes: Optional[int]


class _WorkerGauges:
    """`ors_workers_alive`, `ors_worker_episodes` and `ors_worker_resident_memory_bytes`, read
    from the worker pools at each scrape: no call pays for them, and a dead worker's series go
    with it (a Collector, since a labelled Gauge keeps every series until removed)."""

    def __init__(self) -> None:
        self.pools: list[Callable[[], Iterable[WorkerReading]]] = []

    def describe(self) -> list[GaugeMetricFamily]:
        return list(self._families())

    def collect(self) -> list[GaugeMetricFamily]:
        alive, episodes, memory = self._families()
        readings = [reading for read in list(self.pools) for reading in read()]
        alive.add_metric([], len(readings))
        for reading in readings:
            worker = str(reading.worker_id)
            episodes.add_metric([worker], reading.episodes)
            if reading.rss_bytes is not None:
                memory.add_metric([worker], reading.rss_bytes)
        return [alive, episodes, memory]

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("ors_workers_alive", "Worker processes up and serving (--workers, --isolation episode)."),
            GaugeMetricFamily("ors_worker_episodes", "Episodes living in each worker process.", labels=["worker"]),
            GaugeMetricFamily("ors_worker_resident_memory_bytes", "Resident memory (RSS) of each worker process.",
                              labels=["worker"]),
        )


_worker_gauges = _WorkerGauges()


def track_workers(read: Callable[[], Iterable[WorkerReading]]) -> Callable[[], None]:
    """Expose the workers `read()` returns at every scrape (a worker pool's live workers), and
    every restart cause at 0; returns the function that stops it. Servers without workers never
    call it: they expose no worker series."""
    if not _worker_gauges.pools:
        REGISTRY.register(_worker_gauges)
    _worker_gauges.pools.append(read)
    for cause in CRASH_CAUSES:
        WORKER_RESTARTS.labels(cause)

    def untrack() -> None:
        if read in _worker_gauges.pools:
            _worker_gauges.pools.remove(read)
            if not _worker_gauges.pools:
                REGISTRY.unregister(_worker_gauges)

    return untrack


def worker_died(cause: str) -> None:
    """A worker process ended unplanned (`cause`, one of CRASH_CAUSES) and is replaced."""
    WORKER_RESTARTS.labels(cause).inc()


# --- gRPC status codes, from a server interceptor --------------------------------


def _method_name(full_method: str) -> str:
    """`/ors.v1.EnvironmentService/CallTool` -> `CallTool` (health and
    reflection keep their service: they are few and fixed)."""
    service, _, method = full_method.rpartition("/")
    return method if service.endswith("EnvironmentService") else full_method.lstrip("/")


def _status_name(context: grpc.aio.ServicerContext, raised: BaseException | None) -> str:
    if isinstance(raised, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED.name
    code = context.code()  # set by context.abort / set_code
    if isinstance(code, grpc.StatusCode):
        return code.name
    # An exception that was not an abort becomes UNKNOWN on the wire.
    return grpc.StatusCode.UNKNOWN.name if raised is not None else grpc.StatusCode.OK.name


class RpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts every RPC by method and final status code. Install it first, so
    it also sees the calls other interceptors reject."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        return _counted_handler(handler, details.method)


@functools.lru_cache(maxsize=256)
def _counted_handler(handler: grpc.RpcMethodHandler, full_method: str) -> grpc.RpcMethodHandler:
    """`handler` counting its RPCs, made once per handler (the in-process channel's handlers are the
    same objects call after call; a door makes ten RPCs an episode)."""
    method = _method_name(full_method)
    return wrap_behavior(handler, functools.partial(_counted_unary, method=method),
                         functools.partial(_counted_stream, method=method))


@functools.lru_cache(maxsize=None)  # methods and status codes are fixed sets
def _handled(method: str, code: str) -> Counter:
    return RPCS_HANDLED.labels(method, code)


def _counted_unary(behavior: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Awaitable[Any]]:
    async def counted(request: Any, context: grpc.aio.ServicerContext) -> Any:
        raised: BaseException | None = None
        try:
            return await behavior(request, context)
        except BaseException as exc:
            raised = exc
            raise
        finally:
            _handled(method, _status_name(context, raised)).inc()

    return counted


def _counted_stream(behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    """Counts a server-streaming or bidirectional RPC (`request` is then the request iterator)."""

    async def counted(request: Any, context: grpc.aio.ServicerContext) -> Any:
        raised: BaseException | None = None
        try:
            messages = behavior(request, context)
            if inspect.isawaitable(messages):  # a coroutine handler: writes with context.write, or only aborts
                await messages
            else:
                async for message in messages:
                    yield message
        except BaseException as exc:
            raised = exc
            raise
        finally:
            _handled(method, _status_name(context, raised)).inc()

    return counted


# --- exposition -------------------------------------------------------------------


async def _metrics(request: web.Request) -> web.Response:
    from aiohttp import web

    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def start_metrics_server(host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, int]:
    """Serve `GET /metrics` on host:port (0 picks a free port) in the running
    loop; returns the runner (stop it with `await runner.cleanup()`) and the port.

    A port of its own, not a route on the ORS port: the ORS port faces agents,
    the metrics port faces the operator's scraper.
    """
    from aiohttp import web

    app = web.Application()
    app.router.add_get("/metrics", _metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, runner.addresses[0][1]
