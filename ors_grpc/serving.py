"""The composition root: binds every door of a process, announces them, and
stops them together on SIGINT, or once SIGTERM has drained the server.

`serve` runs the gRPC service (``ors_grpc._runtime``) with, on request, the
HTTP door (``http_bridge``) and the MCP door (``mcp_bridge``) in the same
event loop over the in-process channel; `bridge` runs those doors alone over
a channel to a remote backend. The ``ors-grpc`` command (`ors_grpc.cli`) and `ors_grpc.server.Server.run`
both call these; this is the only module that imports the doors.

Once every door accepts connections, each is announced on stdout as
`DOOR listening on HOST:PORT` (tools parse these lines), then one line for
people names what is served. A startup mistake raises `StartupError` before
anything is announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import importlib.util
import logging
import os
import signal
import socket
import ssl
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Iterator, Sequence

import grpc

from http_bridge import HttpLimits, start_bridge
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc._runtime import garbage_collection
from ors_grpc._runtime.drain import Drain
from ors_grpc._runtime.grpc_server import ServerConfig, create_server
from ors_grpc._runtime.loop_monitor import STALL_WARNING_S
from ors_grpc._runtime.service import environment_map, toolset_map
from ors_grpc._runtime.workers.placement import worker_count
from ors_grpc._runtime.workers.startup import WorkerStartupError, unimportable
from ors_grpc.authoring.environment import Environment, ToolSignatureError
from ors_grpc.extras import extra_install_command
from ors_grpc.observability.metrics import start_metrics_server
from ors_grpc.protocol.browser_policy import BrowserPolicy
from ors_grpc.protocol.constants import API_KEY_METADATA_KEY, DEFAULT_MAX_MESSAGE_BYTES

__all__ = [
    "BridgeOptions", "DrainError", "HttpLimits", "StartupError", "bridge", "check_environments",
    "contained_by_default", "drain", "serve",
]

#: The modules of the `mcp` extra the MCP door imports, and what each is.
MCP_EXTRA_MODULES = {"mcp": "the MCP SDK 'mcp'", "uvicorn": "'uvicorn'", "starlette": "'starlette'"}
#: Seconds running RPCs get to finish after a stop signal.
SHUTDOWN_GRACE_S = 5.0

logger = logging.getLogger("ors_grpc.cli")


#: The exit status of a server that could not start (a StartupError).
EXIT_STARTUP_ERROR = 2


class StartupError(Exception):
    """A mistake in how serving was started (a bad environment, port or TLS
    file): the CLI prints it as one line and exits with status 2."""


def check_environments(environments: Sequence[type[Environment]]) -> list[str]:
    """The names the environments are served under; a StartupError for one that cannot be served
    (no tools, a @tool with a signature that cannot work, no splits, a duplicate name)."""
    try:
        return list(environment_map(environments))
    except (ToolSignatureError, TypeError, ValueError) as exc:
        raise StartupError(str(exc)) from None


async def serve(
    environments: Sequence[type[Environment]],
    *,
    host: str,
    port: int,
    http_port: int | None = None,
    mcp_port: int | None = None,
    metrics_port: int | None = None,
    config: ServerConfig = ServerConfig(),
    http_limits: HttpLimits = HttpLimits(),
    toolsets: Any = (),
) -> None:
    """Serve gRPC (and the HTTP door on `http_port`, the MCP door on `mcp_port`), announcing the doors
    once all are bound, until SIGINT, or until SIGTERM (or the Drain RPC)
    has drained the server (`Drain`; a second signal cuts the drain short);
    then stop gracefully: running calls get a short grace, and every
    session left is torn down. With TLS every door serves it, from the same
    certificate and key."""
    names = check_environments(environments)
    faulthandler.enable(all_threads=False)  # a fatal signal (a native library's SIGSEGV) prints where the code was
    config = contained_by_default(environments, toolsets, config)
    ssl_context = https_context(config.tls_cert, config.tls_key)
    start_mcp_door = _mcp_door_starter() if mcp_port is not None else None
    policy = _browser_policy(host, config.allowed_hosts, config.allowed_origins)
    # Every door's port is checked before worker processes start (a port in use is one line, at once).
    for door, door_port in (("gRPC", port), ("HTTP", http_port), ("MCP", mcp_port), ("metrics", metrics_port)):
        if door_port is not None:
            await _bind(door, host, door_port, _probe_port(host, door_port))
    try:
        server, bound_port = await _bind(
            "gRPC", host, port, create_server(environments, f"{host}:{port}", config=config, toolsets=toolsets)
        )
    except WorkerStartupError as exc:
        raise StartupError(str(exc)) from None
    runners: list[Any] = []
    try:
        with _serve_signals() as signals:
            bound_http_port = None
            if http_port is not None:
                # Same process: the door calls the service without a socket
                # (the in-process channel and the service keep the message limit).
                runner, bound_http_port = await _bind("HTTP", host, http_port, start_bridge(
                    _local_target(host, bound_port), host, http_port,
                    channel=server.in_process_channel, max_body_bytes=config.max_message_bytes,
                    max_message_bytes=config.max_message_bytes, ssl_context=ssl_context, http_limits=http_limits,
                    browser_policy=policy, advertise_host=config.advertise_host or None,
                ))
                runners.append(runner)
            bound_mcp_port = None
            if mcp_port is not None:
                mcp_door, bound_mcp_port = await _bind("MCP", host, mcp_port, start_mcp_door(
                    _local_target(host, bound_port), host, mcp_port, channel=server.in_process_channel,
                    max_message_bytes=config.max_message_bytes, session_idle_timeout_s=config.session_timeout_s,
                    tls_cert=config.tls_cert, tls_key=config.tls_key, browser_policy=policy,
                ))
                runners.append(mcp_door)
            bound_metrics_port = await _start_metrics(host, metrics_port, runners)
            garbage_collection.settle()
            _announce_doors(host, bound_port, bound_http_port, bound_metrics_port, mcp_port=bound_mcp_port,
                            scheme=_scheme(ssl_context), serving=_serving_line(names))
            await _until_drained_or_stopped(server.drain, signals)
    finally:
        # All at once: an HTTP call waiting on a running tool ends when the
        # gRPC stop cancels its stream after the grace period; stopping HTTP
        # first would wait for it for aiohttp's shutdown timeout (60 s).
        await asyncio.gather(*(r.cleanup() for r in runners), server.stop(SHUTDOWN_GRACE_S))
    logger.info("server_stopped")


def contained_by_default(
    environments: Sequence[type[Environment]], toolsets: Any, config: ServerConfig
) -> ServerConfig:
    """`config` with the default of a server that owns its process: environments' code in one
    worker process per CPU, unless `config.workers` says otherwise (0: in-process). Where workers
    could not load a class (made at run time, or in `__main__` with no script file), the code
    runs in-process, and one log line says why."""
    if config.workers is not None or config.isolation is not None:
        return config
    why = unimportable(environments, toolset_map(toolsets).values())
    if why is not None:
        logger.warning("serving_in_process reason=%r: its faults and stalls reach the server "
                       "(docs/reliability.md)", why)
        return replace(config, workers=0)
    return replace(config, workers=worker_count("auto"))


#: Seconds between the progress reports of `drain --wait`.
DRAIN_POLL_S = 1.0


async def drain(target: str, *, api_key: str | None = None, wait: bool = False) -> None:
    """Ask the `ors-grpc serve` at `target` (on this host) to drain, printing
    how many episodes it holds; with `wait`, report until it has exited.
    A refusal or an unreachable server is a `DrainError`."""
    metadata = ((API_KEY_METADATA_KEY, api_key),) if api_key else ()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        reported = None
        while True:
            try:
                answer = await stub.Drain(pb.DrainRequest(), metadata=metadata)
            except grpc.aio.AioRpcError as error:
                # (A poll that reaches the server as it stops is answered CANCELLED.)
                if reported is not None and error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    print(f"{target} has stopped", flush=True)
                    return
                raise DrainError(f"{target}: {error.code().name}: {error.details()}") from None
            if answer.open_sessions != reported:
                print(f"{target} is draining: {answer.open_sessions} episodes open, "
                      f"{answer.seconds_left:.0f} s left", flush=True)
                reported = answer.open_sessions
            if not wait:
                return
            await asyncio.sleep(DRAIN_POLL_S)


class DrainError(Exception):
    """`drain` could not drain its target: the CLI prints it as one line and exits with status 1."""


@dataclass(frozen=True)
class BridgeOptions:
    """How the standalone HTTP door reaches its backend, and what it accepts."""

    #: Largest gRPC message either way.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: Largest HTTP request body (None: as `max_message_bytes`).
    max_body_bytes: int | None = None
    #: PEM certificate chain and key: serve HTTPS.
    tls_cert: str | None = None
    tls_key: str | None = None
    #: Reach the backend over TLS, trusting this PEM root certificate.
    backend_tls_root_cert: str | None = None
    #: The name to check in the backend's certificate (None: the backend host).
    backend_tls_server_name: str | None = None
    #: `Host` values and page origins the doors serve beyond loopback's (as `ServerConfig`'s).
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()


async def bridge(
    backend: str,
    *,
    host: str,
    http_port: int | None,
    mcp_port: int | None = None,
    metrics_port: int | None = None,
    options: BridgeOptions = BridgeOptions(),
    http_limits: HttpLimits = HttpLimits(),
) -> None:
    """Serve the HTTP door (on `http_port`) and the MCP door (on `mcp_port`) onto
    the gRPC backend at `backend` (HOST:PORT) until SIGINT/SIGTERM, announcing them once bound."""
    ssl_context = https_context(options.tls_cert, options.tls_key)
    policy = _browser_policy(host, options.allowed_hosts, options.allowed_origins)
    if options.backend_tls_root_cert:
        _check_readable("--backend-tls-root-cert", options.backend_tls_root_cert)
    start_mcp_door = _mcp_door_starter() if mcp_port is not None else None
    runners: list[Any] = []
    try:
        bound_http_port = bound_mcp_port = None
        if http_port is not None:
            runner, bound_http_port = await _bind("HTTP", host, http_port, start_bridge(
                backend, host, http_port, max_body_bytes=options.max_body_bytes or options.max_message_bytes,
                max_message_bytes=options.max_message_bytes, http_limits=http_limits, ssl_context=ssl_context,
                tls_root_cert=options.backend_tls_root_cert, tls_server_name=options.backend_tls_server_name,
                browser_policy=policy,
            ))
            runners.append(runner)
        if mcp_port is not None:
            mcp_door, bound_mcp_port = await _bind("MCP", host, mcp_port, start_mcp_door(
                backend, host, mcp_port, max_message_bytes=options.max_message_bytes,
                tls_cert=options.tls_cert, tls_key=options.tls_key,
                tls_root_cert=options.backend_tls_root_cert, tls_server_name=options.backend_tls_server_name,
                browser_policy=policy,
            ))
            runners.append(mcp_door)
        with _stop_signals() as stop:
            bound_metrics_port = await _start_metrics(host, metrics_port, runners)
            garbage_collection.settle()
            _announce_doors(host, None, bound_http_port, bound_metrics_port, mcp_port=bound_mcp_port,
                            scheme=_scheme(ssl_context), serving=f"bridging onto gRPC backend {backend}")
            await stop.wait()
    finally:
        await asyncio.gather(*(r.cleanup() for r in runners))


class _ServeSignals:
    """What the stop signals of `serve` asked for: the first SIGTERM a drain;
    SIGINT, or any signal after the first, a stop at once. The event loop
    takes them (`received`); one held by environments' code (`--in-process`)
    takes none, so a signal that comes while an earlier one has waited for
    the loop over `STALL_WARNING_S` exits the process at once (`arrived`)."""

    def __init__(self) -> None:
        self.drain = asyncio.Event()
        self.stop = asyncio.Event()
        #: When the oldest signal the loop has not taken yet arrived (monotonic); None: it took them all.
        self.waiting_since: float | None = None

    def received(self, signum: int) -> None:
        self.waiting_since = None
        if signum == signal.SIGTERM and not (self.drain.is_set() or self.stop.is_set()):
            self.drain.set()
        else:
            self.stop.set()

    def arrived(self, signum: int) -> None:
        """Runs in the main thread as the signal arrives, between two bytecodes of whatever runs
        there, environments' code holding the loop included (C code holding the GIL excepted)."""
        now = time.monotonic()
        if self.waiting_since is None:
            self.waiting_since = now
        elif now - self.waiting_since >= STALL_WARNING_S:
            logger.error("stop_forced signal=%s waited_s=%.1f: the event loop has not taken the stop signals, "
                         "environments' code holds it (the event_loop_stalled line names it); exiting without "
                         "ending the episodes", signal.Signals(signum).name, now - self.waiting_since)
            sys.stderr.flush()
            os._exit(128 + signum)


@contextlib.contextmanager
def _serve_signals() -> Iterator[_ServeSignals]:
    """SIGINT and SIGTERM from now on (see `_ServeSignals`); taken before any
    door is announced, as `_stop_signals`."""
    signals = _ServeSignals()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, signals.received, signum)
        _also_on_arrival(signum, signals.arrived)
    try:
        yield signals
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def _also_on_arrival(signum: int, arrived: Callable[[int], None]) -> None:
    """Calls `arrived(signum)` from the Python-level handler of `signum`, after the one the event
    loop installed (asyncio's and uvloop's only note the signal: the loop reads it off its wakeup
    file descriptor, which the interpreter writes to whatever handler is installed)."""
    loop_handler = signal.getsignal(signum)

    def handler(number: int, frame: Any) -> None:
        if callable(loop_handler):
            loop_handler(number, frame)
        arrived(number)

    signal.signal(signum, handler)


#: How to stop `serve` at once while it drains (`_ServeSignals`), in the drain's log line and on stdout.
STOP_AT_ONCE_HINT = "press Ctrl-C (SIGINT) or send a second SIGTERM"


async def _until_drained_or_stopped(drain: Drain, signals: _ServeSignals) -> None:
    """Serve until a stop; or until a drain (SIGTERM or the Drain RPC) has
    seen every episode end or timed out, unless a stop cuts it short."""
    drain.stop_at_once_hint = STOP_AT_ONCE_HINT
    await _first_of(signals.stop.wait(), signals.drain.wait(), drain.begun.wait())
    if signals.stop.is_set():
        return
    await drain.begin()
    print(f"draining: {drain.open_sessions} episodes open, served for up to {drain.seconds_left:.0f} s while new "
          f"ones are refused; to stop at once, {STOP_AT_ONCE_HINT}", flush=True)
    await _first_of(signals.stop.wait(), drain.until_done())
    if signals.stop.is_set():
        logger.warning("drain_cut_short open_sessions=%d", drain.open_sessions)


async def _first_of(*waits: Awaitable[Any]) -> None:
    """Returns when the first of `waits` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def _stop_signals() -> Iterator[asyncio.Event]:
    """An event that SIGINT or SIGTERM sets from now on. Taken before any door
    is announced, so a signal sent right after an announcement stops gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        yield stop
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def _local_target(host: str, port: int) -> str:
    """Where a co-located client reaches a server bound to `host`."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"{host}:{port}"


async def _bind(door: str, host: str, port: int, start: Awaitable[Any]) -> Any:
    """Await a door's `start`; a port that cannot be bound is a StartupError naming the door."""
    try:
        return await start
    except OSError as exc:
        # asyncio's strerror is "error while attempting to bind on address (...): address already in use".
        reason = (exc.strerror or str(exc)).rsplit(": ", 1)[-1]
        reason = reason[:1].lower() + reason[1:]
        raise StartupError(f"{door} door: cannot listen on {host}:{port}: {reason}") from None


async def _probe_port(host: str, port: int) -> None:
    """Raise OSError if `port` on `host` cannot be listened on (taken by another program, `host`
    unknown or not an address of this host). For the gRPC door: grpc reports only that binding
    failed, after logging a C-level error line of its own."""
    loop = asyncio.get_running_loop()
    for family, kind, proto, _, address in await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    ):
        with socket.socket(family, kind, proto) as probe:
            # As grpc's own listener: a port held only by TIME_WAIT connections is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
            probe.listen()


async def _start_metrics(host: str, metrics_port: int | None, runners: list[Any]) -> int | None:
    """Start the Prometheus /metrics server when asked for (its runner joins
    `runners`); its port, else None."""
    if metrics_port is None:
        return None
    runner, port = await _bind("metrics", host, metrics_port, start_metrics_server(host, metrics_port))
    runners.append(runner)
    return port


def _scheme(ssl_context: ssl.SSLContext | None) -> str:
    return "https://" if ssl_context else "http://"


#: What the line for people adds after a door's address.
_DOOR_PATHS = {"metrics": "/metrics", "MCP": "/{env}/mcp/{session_id}"}


def _announce_doors(host: str, grpc_port: int | None, http_port: int | None, metrics_port: int | None,
                    *, mcp_port: int | None = None, scheme: str, serving: str) -> None:
    """Once every door is bound: `DOOR listening on HOST:PORT` for each (tools parse these lines),
    then one line for people, naming what is served and where."""
    doors = [("gRPC", grpc_port, ""), ("HTTP", http_port, scheme), ("MCP", mcp_port, scheme),
             ("metrics", metrics_port, "http://")]
    where = []
    for door, port, prefix in doors:
        if port is not None:
            print(f"{door} listening on {host}:{port}", flush=True)
            where.append(f"{door} {prefix}{host}:{port}{_DOOR_PATHS.get(door, '')}")
    print(f"{serving}: {', '.join(where)}", flush=True)


def _serving_line(names: Sequence[str]) -> str:
    first, *others = names
    return "serving " + ", ".join([f"{first} (default)", *others])


def _browser_policy(host: str, allowed_hosts: Sequence[str], allowed_origins: Sequence[str]) -> BrowserPolicy:
    """The Host and Origin rule both doors bound to `host` share; a StartupError for a malformed entry."""
    try:
        return BrowserPolicy.for_bind(host, allowed_hosts, allowed_origins)
    except ValueError as exc:
        raise StartupError(str(exc)) from None


def https_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """A server TLS context from PEM files, or None without them; a StartupError when they cannot serve."""
    if not cert and not key:
        return None
    if not (cert and key):
        raise StartupError("TLS needs both --tls-cert and --tls-key")
    for option, path in (("--tls-cert", cert), ("--tls-key", key)):
        _check_readable(option, path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise StartupError(f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate and its key ({exc})") from None
    return context


def _check_readable(option: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise StartupError(f"{option} {path}: {exc.strerror}") from None


def _mcp_door_starter() -> Any:
    """`mcp_bridge.start_mcp_door`, imported only when the MCP door is asked
    for: its SDK is the `mcp` extra (pyproject.toml says why), and it imports
    OpenTelemetry at import time, which a server without the MCP door must
    not need. A StartupError naming what is missing and the install command when it is."""
    missing = [what for module, what in MCP_EXTRA_MODULES.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise StartupError(f"the MCP door (--mcp-port) needs the mcp extra, which is not installed "
                           f"(missing: {', '.join(missing)}): {mcp_extra_install_command()}")
    from mcp_bridge import start_mcp_door

    return start_mcp_door


def mcp_extra_install_command() -> str:
    """The pip command that adds the `mcp` extra (see `extra_install_command`)."""
    return extra_install_command("mcp")
