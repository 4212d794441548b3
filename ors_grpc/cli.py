"""The `ors-grpc` command: `serve` environments over gRPC (and HTTP), or run only the `bridge`.

    ors-grpc serve [MODULE:CLASS ...] [--host H] [--port P] [--http-port P] ...
    ors-grpc bridge --backend HOST:PORT [--host H] [--http-port P]

Both take `--metrics-port P` to serve Prometheus metrics at /metrics.

Once every door accepts connections, each prints `gRPC listening on HOST:PORT` /
`HTTP listening on HOST:PORT` / `metrics listening on HOST:PORT` (port 0 picks a free port), then one line names
the environments and doors. SIGINT and SIGTERM stop gracefully: no new work, every session torn down, exit status 0.
A startup mistake (a bad environment or port, a port in use, a TLS file missing) is one line on stderr and exit
status 2; nothing is announced before every door is bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import math
import os
import signal
import socket
import ssl
import sys
from typing import Any, Awaitable, Callable, Iterator, NoReturn, Sequence

from .warm_pool import DEFAULT_WARM_TTL_S

__all__ = ["main"]

DEFAULT_ENVIRONMENT = "ors_grpc.examples.arithmetic:Arithmetic"
DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# Seconds running RPCs get to finish after a stop signal.
SHUTDOWN_GRACE_S = 5.0
EXIT_STARTUP_ERROR = 2
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_LOG_LEVEL = "INFO"

logger = logging.getLogger("ors_grpc.cli")


class StartupError(Exception):
    """A mistake in how the command was started: `main` prints it as one line and exits with status 2."""


def load_environment(spec: str) -> type:
    """Import the Environment class `module.path:ClassName` (see `_import_class`)."""
    from .environment import Environment

    found = _import_class(spec, "environment")
    if not (isinstance(found, type) and issubclass(found, Environment)):
        hint = ""
        if isinstance(found, type) and any(base.__module__.split(".")[0] == "ors" for base in found.__mro__):
            hint = " (it subclasses the reference SDK's: import Environment from ors_grpc instead of ors)"
        raise StartupError(f"{spec} is not a subclass of ors_grpc.Environment{hint}")
    return found


def load_toolset(spec: str) -> type:
    """Import the toolset class `module.path:ClassName` (see `_import_class`)."""
    found = _import_class(spec, "toolset")
    if not isinstance(found, type):
        raise StartupError(f"toolset {spec} is not a class")
    return found


def _import_class(spec: str, what: str) -> object:
    """Import `module.path:ClassName` (the current directory is importable).

    An exception raised while the module itself runs propagates, with the
    traceback into the user's own code."""
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise StartupError(f"{what} must look like module.path:ClassName, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise  # the user's module imports something missing: show where
        raise StartupError(f"cannot import {module_name!r}: {exc}") from None
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise StartupError(f"module {module_name!r} has no attribute {class_name!r}") from None


def _check_environments(environments: Sequence[type]) -> list[str]:
    """The names the environments are served under; a StartupError for one that cannot be served
    (no tools, a @tool with a signature that cannot work, no splits, a duplicate name)."""
    from .environment import ToolSignatureError
    from .service import environment_map

    try:
        return list(environment_map(environments))
    except (ToolSignatureError, TypeError, ValueError) as exc:
        raise StartupError(str(exc)) from None


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range 0-65535")
    return port


def _backend_target(text: str) -> str:
    """An argparse type: HOST:PORT with a valid port."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"backend must look like HOST:PORT, got {text!r}")
    _port(port)
    return text


def _positive_number(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (0 < value < math.inf):
            raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


class _ArgumentParser(argparse.ArgumentParser):
    """A usage mistake is one line on stderr (and exit status 2), pointing at --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_STARTUP_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default in its help, unless it has none or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "(default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    formatter = _HelpFormatter
    parser = _ArgumentParser(
        prog="ors-grpc", description="Open Reward Standard over gRPC.", formatter_class=formatter
    )
    log_level = {"type": str.upper, "choices": LOG_LEVELS, "metavar": "LEVEL"}
    levels = ", ".join(LOG_LEVELS)
    parser.add_argument("--log-level", default=DEFAULT_LOG_LEVEL, help=f"logging level on stderr: {levels}", **log_level)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{serve,bridge}")
    # Subcommand options too (`ors-grpc serve --log-level DEBUG`); SUPPRESS
    # keeps the main parser's value when it is not given here.
    sub_log_level = {
        "default": argparse.SUPPRESS, "help": f"logging level on stderr: {levels} (default: {DEFAULT_LOG_LEVEL})",
        **log_level,
    }

    serve = commands.add_parser(
        "serve", help="serve environments over gRPC (and HTTP with --http-port)", formatter_class=formatter,
        description="Serve environments over gRPC, and the ORS HTTP/SSE API with --http-port.",
    )
    serve.add_argument("environments", nargs="*", metavar="ENV", default=[DEFAULT_ENVIRONMENT],
                       help="module.path:ClassName of an environment to serve; the first is the default one "
                       f"(default: {DEFAULT_ENVIRONMENT})")
    serve.add_argument("--host", default="127.0.0.1", help="address every door binds (0.0.0.0: all interfaces)")
    serve.add_argument("--port", "--grpc-port", dest="port", type=_port, default=50051, metavar="PORT",
                       help="gRPC port (0: any free port)")
    serve.add_argument("--http-port", type=_port, metavar="PORT", default=None,
                       help="also serve the ORS HTTP/SSE API on this port (0: any free port)")
    serve.add_argument("--metrics-port", type=_port, metavar="PORT", default=None, help="serve Prometheus /metrics on this port")
    serve.add_argument("--api-key", default=None, help="require this x-api-key on every call but health")
    serve.add_argument("--session-timeout", type=_positive_number(float), default=900.0, metavar="SECONDS",
                       help="seconds before an idle session is reaped")
    serve.add_argument("--max-sessions", type=_positive_number(int), default=None, metavar="N",
                       help="most episodes open at once; more fail with TOO_MANY_SESSIONS (default: no limit)")
    serve.add_argument("--tool-timeout", type=_positive_number(float), default=None, metavar="SECONDS",
                       help="seconds a tool call may run (default: no limit)")
    serve.add_argument("--warm-ttl", type=_positive_number(float), default=DEFAULT_WARM_TTL_S, metavar="SECONDS",
                       help="seconds an episode prepared ahead is held unclaimed once set up")
    serve.add_argument("--max-message-bytes", type=_positive_number(int), default=DEFAULT_MAX_MESSAGE_BYTES,
                       metavar="BYTES", help="largest gRPC message and HTTP body, either way")
    serve.add_argument("--tls-cert", default=None, metavar="FILE",
                       help="PEM certificate chain: serve TLS on the gRPC and HTTP doors (needs --tls-key)")
    serve.add_argument("--tls-key", default=None, metavar="FILE", help="PEM private key of --tls-cert")
    serve.add_argument("--toolset", dest="toolsets", action="append", default=[], metavar="MODULE:CLASS",
                       help="register a Toolset that episodes may attach by name (toolset_name); repeatable")
    serve.add_argument("--setup-wait", type=_positive_number(float), default=25.0, metavar="SECONDS",
                       help="seconds a session call waits for setup before answering 'still starting' (503)")
    serve.add_argument("--log-level", **sub_log_level)
    _add_http_limits(serve)

    bridge = commands.add_parser(
        "bridge", help="serve only the HTTP/SSE bridge onto a gRPC backend", formatter_class=formatter,
        description="Serve the ORS HTTP/SSE API, translating each request onto a remote gRPC backend.",
    )
    bridge.add_argument("--backend", required=True, type=_backend_target, metavar="HOST:PORT",
                        help="the ors-grpc gRPC backend (or a load balancer in front of several)")
    bridge.add_argument("--host", default="127.0.0.1", help="address every door binds (0.0.0.0: all interfaces)")
    bridge.add_argument("--http-port", type=_port, metavar="PORT", default=8080, help="HTTP port (0: any free port)")
    bridge.add_argument("--metrics-port", type=_port, metavar="PORT", default=None, help="serve Prometheus /metrics on this port")
    bridge.add_argument("--max-message-bytes", type=_positive_number(int), default=DEFAULT_MAX_MESSAGE_BYTES,
                        metavar="BYTES", help="largest gRPC message either way (as serve's --max-message-bytes)")
    bridge.add_argument("--max-body-bytes", type=_positive_number(int), default=None,
                        metavar="BYTES", help="largest HTTP request body (default: as --max-message-bytes)")
    bridge.add_argument("--tls-cert", default=None, metavar="FILE",
                        help="PEM certificate chain: serve HTTPS (needs --tls-key)")
    bridge.add_argument("--tls-key", default=None, metavar="FILE", help="PEM private key of --tls-cert")
    bridge.add_argument("--backend-tls-root-cert", default=None, metavar="FILE",
                        help="reach the backend over TLS, trusting this PEM root certificate")
    bridge.add_argument("--backend-tls-server-name", default=None, metavar="NAME",
                        help="the name to check in the backend's certificate (default: the backend host)")
    bridge.add_argument("--log-level", **sub_log_level)
    _add_http_limits(bridge)
    return parser


def _add_http_limits(parser: argparse.ArgumentParser) -> None:
    """The HTTP port's timeouts and connection cap (http_bridge/_http_server.py)."""
    parser.add_argument("--http-header-timeout", type=_positive_number(float), default=30.0, metavar="SECONDS",
                        help="seconds a connection may take to send a request head (and stay idle between requests)")
    parser.add_argument("--http-body-timeout", type=_positive_number(float), default=60.0, metavar="SECONDS",
                        help="seconds a request body may take to arrive")
    parser.add_argument("--http-max-connections", type=_positive_number(int), default=None, metavar="N",
                        help="open HTTP connections at most (default: 3/4 of the file descriptor limit, "
                             "at most 10,000); more are answered 503")


def _http_limits(args: argparse.Namespace) -> Any:
    from http_bridge import HttpLimits

    return HttpLimits(header_timeout_s=args.http_header_timeout, body_timeout_s=args.http_body_timeout,
                      max_connections=args.http_max_connections)


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


async def _start_metrics(host: str, metrics_port: int | None) -> tuple[Any, int | None]:
    """The Prometheus /metrics server and its port when asked for, else (None, None)."""
    if metrics_port is None:
        return None, None
    from .metrics import start_metrics_server

    return await _bind("metrics", host, metrics_port, start_metrics_server(host, metrics_port))


def _announce_doors(host: str, grpc_port: int | None, http_port: int | None, metrics_port: int | None,
                    *, scheme: str, serving: str) -> None:
    """Once every door is bound: `DOOR listening on HOST:PORT` for each (tools parse these lines),
    then one line for people, naming what is served and where."""
    doors = [("gRPC", grpc_port, ""), ("HTTP", http_port, scheme), ("metrics", metrics_port, "http://")]
    where = []
    for door, port, prefix in doors:
        if port is not None:
            print(f"{door} listening on {host}:{port}", flush=True)
            suffix = "/metrics" if door == "metrics" else ""
            where.append(f"{door} {prefix}{host}:{port}{suffix}")
    print(f"{serving}: {', '.join(where)}", flush=True)


def _serving_line(names: Sequence[str]) -> str:
    first, *others = names
    return "serving " + ", ".join([f"{first} (default)", *others])


async def serve_until_signal(
    environments: Sequence[type], host: str, port: int, http_port: int | None, config: Any,
    metrics_port: int | None = None, http_limits: Any = None, *, toolsets: Any = (),
) -> None:
    """Serve gRPC (and the HTTP bridge on `http_port`) until SIGINT/SIGTERM,
    announcing the doors on stdout once all are bound; then stop gracefully.
    With TLS both doors serve it, from the same certificate and key."""
    from .server import create_server, in_process_channel

    names = _check_environments(environments)
    ssl_context = _https_context(config.tls_cert, config.tls_key)
    await _bind("gRPC", host, port, _probe_port(host, port))
    server, bound_port = await _bind(
        "gRPC", host, port, create_server(environments, f"{host}:{port}", config=config, toolsets=toolsets)
    )
    runner: Any = None
    metrics_runner: Any = None
    bound_http_port: int | None = None
    try:
        with _stop_signals() as stop:
            if http_port is not None:
                from http_bridge import start_bridge

                # Same process: the bridge calls the service without a socket
                # (the in-process channel and the service keep the message limit).
                limits = {} if http_limits is None else {"http_limits": http_limits}
                runner, bound_http_port = await _bind("HTTP", host, http_port, start_bridge(
                    _local_target(host, bound_port), host, http_port,
                    channel=in_process_channel(server), max_body_bytes=config.max_message_bytes,
                    max_message_bytes=config.max_message_bytes, ssl_context=ssl_context, **limits,
                ))
            metrics_runner, bound_metrics_port = await _start_metrics(host, metrics_port)
            scheme = "https://" if ssl_context else "http://"
            _announce_doors(host, bound_port, bound_http_port, bound_metrics_port,
                            scheme=scheme, serving=_serving_line(names))
            await stop.wait()
    finally:
        # All at once: an HTTP call waiting on a running tool ends when the
        # gRPC stop cancels its stream after the grace period; stopping HTTP
        # first would wait for it for aiohttp's shutdown timeout (60 s).
        runners = [r for r in (runner, metrics_runner) if r is not None]
        await asyncio.gather(*(r.cleanup() for r in runners), server.stop(SHUTDOWN_GRACE_S))
    logger.info("server_stopped")


def _https_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
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


async def _serve(args: argparse.Namespace) -> None:
    from .server import ServerConfig

    environments = [load_environment(spec) for spec in args.environments or [DEFAULT_ENVIRONMENT]]
    config = ServerConfig(
        session_timeout_s=args.session_timeout,
        max_message_bytes=args.max_message_bytes,
        api_key=args.api_key,
        max_sessions=args.max_sessions,
        tool_timeout_s=args.tool_timeout,
        warm_ttl_s=args.warm_ttl,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        setup_wait_s=args.setup_wait,
    )
    toolsets = [load_toolset(spec) for spec in args.toolsets]
    await serve_until_signal(environments, args.host, args.port, args.http_port, config, args.metrics_port,
                             _http_limits(args), toolsets=toolsets)


async def _bridge(args: argparse.Namespace) -> None:
    from http_bridge import start_bridge

    ssl_context = _https_context(args.tls_cert, args.tls_key)
    if args.backend_tls_root_cert:
        _check_readable("--backend-tls-root-cert", args.backend_tls_root_cert)
    runner, http_port = await _bind("HTTP", args.host, args.http_port, start_bridge(
        args.backend, args.host, args.http_port, max_body_bytes=args.max_body_bytes or args.max_message_bytes,
        max_message_bytes=args.max_message_bytes, http_limits=_http_limits(args), ssl_context=ssl_context,
        tls_root_cert=args.backend_tls_root_cert, tls_server_name=args.backend_tls_server_name,
    ))
    metrics_runner = None
    try:
        with _stop_signals() as stop:
            metrics_runner, metrics_port = await _start_metrics(args.host, args.metrics_port)
            scheme = "https://" if ssl_context else "http://"
            _announce_doors(args.host, None, http_port, metrics_port,
                            scheme=scheme, serving=f"bridging onto gRPC backend {args.backend}")
            await stop.wait()
    finally:
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="time=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s",
    )
    # grpc's asyncio layer logs `Loaded running loop` at DEBUG for every
    # call: at DEBUG it would drown the server's own lines.
    logging.getLogger("grpc._cython.cygrpc").setLevel(max(logging.INFO, logging.getLevelName(level)))


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    _configure_logging(args.log_level)
    command = _serve if args.command == "serve" else _bridge
    try:
        with asyncio.Runner(loop_factory=_fastest_event_loop()) as runner:
            runner.run(command(args))
    except StartupError as exc:
        print(f"ors-grpc {args.command}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_STARTUP_ERROR)
    _exit_despite_stuck_user_code()


def _fastest_event_loop() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (a dependency on Linux and macOS): the
    HTTP door serves about a quarter more episodes per second on it."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _exit_despite_stuck_user_code() -> None:
    """Exit now if synchronous user code still runs in worker threads.

    Every session is torn down by now; such a thread (a sync tool that
    ignores its episode's end) cannot be interrupted, and Python would wait
    for it at exit, so a stop signal would not stop the process.
    """
    from .user_code import busy_user_code_threads

    stuck = busy_user_code_threads()
    if stuck:
        logger.warning("exiting_with_user_code_running threads=%d", stuck)
        logging.shutdown()
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
