"""The `ors-grpc` command: `serve` environments over gRPC (and HTTP), or run only the `bridge`.

    ors-grpc serve [MODULE:CLASS ...] [--host H] [--port P] [--http-port P] ...
    ors-grpc bridge --backend HOST:PORT [--host H] [--http-port P]
    ors-grpc drain HOST:PORT [--wait]

Both take `--metrics-port P` to serve Prometheus metrics at /metrics.

Once every door accepts connections, each prints `gRPC listening on HOST:PORT` /
`HTTP listening on HOST:PORT` / `metrics listening on HOST:PORT` (port 0 picks a free port), then one line names
the environments and doors. SIGTERM (or `ors-grpc drain`) drains `serve`: health NOT_SERVING, new episodes
refused (DRAINING), the open ones served until they end or --drain-timeout passes; SIGINT, or a second signal, stops at
once. Either way the stop is graceful: no new work, every session torn down, exit status 0.
A startup mistake (a bad environment or port, a port in use, a TLS file missing) is one line on stderr and exit
status 2; nothing is announced before every door is bound.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import math
import os
import sys
from typing import Any, Callable, NoReturn, Sequence

# gRPC's fork handlers (on by default in the C core) cannot serve a grpc.aio
# server, and an environment's forked children never use the parent's gRPC:
# off, unless the user says otherwise, before grpc is first imported. With
# them on, every fork of an environment logs "skipping fork() handlers".
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from ors_grpc import serving  # noqa: E402  (after the fork-support setting)
from ors_grpc._runtime.grpc_server import ServerConfig  # noqa: E402
from ors_grpc._runtime.user_code import busy_user_code_threads  # noqa: E402
from ors_grpc._runtime.workers.placement import worker_count  # noqa: E402
from ors_grpc._runtime.workers.watchdog import DEFAULT_STALL_LIMIT_S  # noqa: E402
from ors_grpc.authoring.environment import Environment  # noqa: E402
from ors_grpc.protocol.constants import (  # noqa: E402
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_SESSION_TIMEOUT_S,
    DEFAULT_SETUP_WAIT_S,
    DEFAULT_WARM_SETUP_TIMEOUT_S,
    DEFAULT_WARM_TTL_S,
)
from ors_grpc.serving import EXIT_STARTUP_ERROR, StartupError  # noqa: E402

__all__ = ["main"]

DEFAULT_ENVIRONMENT = "ors_grpc.examples.arithmetic:Arithmetic"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_LOG_LEVEL = "INFO"
#: The standalone HTTP door's port when no door port is given.
DEFAULT_BRIDGE_HTTP_PORT = 8080

logger = logging.getLogger("ors_grpc.cli")


def load_environment(spec: str) -> type:
    """Import the Environment class `module.path:ClassName` (see `_import_class`)."""
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


def _non_negative_number(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 included."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (0 <= value < math.inf):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


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
    commands = parser.add_subparsers(dest="command", required=True, metavar="{serve,bridge,drain}")
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
    serve.add_argument("--mcp-port", type=_port, metavar="PORT", default=None,
                       help="serve MCP (streamable HTTP, /{env}/mcp/{session_id}) on this port (0: any free port; needs the mcp extra)")
    serve.add_argument("--metrics-port", type=_port, metavar="PORT", default=None, help="serve Prometheus /metrics on this port")
    serve.add_argument("--api-key", default=None, help="require this x-api-key on every call but health")
    serve.add_argument("--session-timeout", type=_positive_number(float), default=DEFAULT_SESSION_TIMEOUT_S,
                       metavar="SECONDS", help="seconds before an idle session is reaped")
    serve.add_argument("--max-sessions", type=_positive_number(int), default=None, metavar="N",
                       help="most episodes open at once; more fail with TOO_MANY_SESSIONS (default: no limit)")
    serve.add_argument("--tool-timeout", type=_positive_number(float), default=None, metavar="SECONDS",
                       help="seconds a tool call may run (default: no limit)")
    serve.add_argument("--warm-ttl", type=_positive_number(float), default=DEFAULT_WARM_TTL_S, metavar="SECONDS",
                       help="seconds an episode prepared ahead is held unclaimed once set up")
    serve.add_argument("--warm-setup-timeout", type=_positive_number(float), default=DEFAULT_WARM_SETUP_TIMEOUT_S,
                       metavar="SECONDS",
                       help="seconds a prepared episode's setup may take from its prepare, then it is cancelled")
    serve.add_argument("--max-message-bytes", type=_positive_number(int), default=DEFAULT_MAX_MESSAGE_BYTES,
                       metavar="BYTES", help="largest gRPC message and HTTP body, either way")
    serve.add_argument("--tls-cert", default=None, metavar="FILE",
                       help="PEM certificate chain: serve TLS on the gRPC and HTTP doors (needs --tls-key)")
    serve.add_argument("--tls-key", default=None, metavar="FILE", help="PEM private key of --tls-cert")
    serve.add_argument("--toolset", dest="toolsets", action="append", default=[], metavar="MODULE:CLASS",
                       help="register a Toolset that episodes may attach by name (toolset_name); repeatable")
    serve.add_argument("--setup-wait", type=_positive_number(float), default=DEFAULT_SETUP_WAIT_S, metavar="SECONDS",
                       help="seconds a session call waits for setup before answering 'still starting' (503)")
    serve.add_argument("--drain-timeout", type=_non_negative_number, default=DEFAULT_DRAIN_TIMEOUT_S,
                       metavar="SECONDS",
                       help="after SIGTERM (or `ors-grpc drain`), seconds the open episodes are served before "
                            "they are ended (0: at once); new episodes are refused meanwhile")
    serve.add_argument("--advertise-host", default=None, metavar="HOST",
                       help="hand out session ids that name HOST and the door's port (this backend's address as "
                            "the proxy in front knows it: Envoy's stateful sessions route them back here; "
                            "docs/deployment.md)")
    serve.add_argument("--workers", type=_workers, default=None, metavar="N|auto",
                       help="run environments' code in N supervised worker processes (auto: one per CPU "
                            "this process may use) instead of the server process; environments must be MODULE:CLASS")
    serve.add_argument("--isolation", choices=["episode"], default=None,
                       help="episode: every episode in a process of its own, which ends with it (a fault costs "
                            "exactly its episode), from a pool of --workers (default 2) started processes")
    serve.add_argument("--worker-memory-limit", type=_positive_number(float), default=None, metavar="MIB",
                       help="with --workers: a worker whose resident memory passes MIB is killed and replaced "
                            "(its episodes are lost, and say so)")
    serve.add_argument("--worker-stall-limit", type=_non_negative_number, default=DEFAULT_STALL_LIMIT_S,
                       metavar="SECONDS",
                       help="with --workers or --isolation: a worker whose event loop one piece of code holds for "
                            "SECONDS (measured in the worker, off its loop: a blocking call in an async def, a "
                            "spin), or that stops reporting for as long (a frozen process), is killed and replaced "
                            "(its episodes are lost, and say so), with or without --tool-timeout; 0: never. Load "
                            "slows a loop but never holds it: the default is far above anything load makes")
    serve.add_argument("--log-level", **sub_log_level)
    _add_http_limits(serve)
    _add_browser_options(serve)

    drain = commands.add_parser(
        "drain", help="drain a running `ors-grpc serve` on this host", formatter_class=formatter,
        description="Ask an `ors-grpc serve` on this host to drain (as SIGTERM does): it turns NOT_SERVING, "
                    "refuses new episodes, serves those it has until they end or its --drain-timeout "
                    "passes, then exits.",
    )
    drain.add_argument("target", type=_backend_target, metavar="HOST:PORT", help="the server's gRPC door (plaintext)")
    drain.add_argument("--api-key", default=None, help="the server's --api-key, if it has one")
    drain.add_argument("--wait", action="store_true", help="report until the server has exited")
    drain.add_argument("--log-level", **sub_log_level)

    bridge = commands.add_parser(
        "bridge", help="serve only the HTTP/SSE bridge onto a gRPC backend", formatter_class=formatter,
        description="Serve the ORS HTTP/SSE API, translating each request onto a remote gRPC backend.",
    )
    bridge.add_argument("--backend", required=True, type=_backend_target, metavar="HOST:PORT",
                        help="the ors-grpc gRPC backend (or a load balancer in front of several)")
    bridge.add_argument("--host", default="127.0.0.1", help="address every door binds (0.0.0.0: all interfaces)")
    bridge.add_argument("--http-port", type=_port, metavar="PORT", default=None,
                        help="HTTP port (0: any free port; none when only --mcp-port is given) (default: 8080)")
    bridge.add_argument("--mcp-port", type=_port, metavar="PORT", default=None,
                        help="serve MCP (streamable HTTP, /{env}/mcp/{session_id}) on this port (0: any free port; needs the mcp extra)")
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
    _add_browser_options(bridge)
    return parser


def _add_http_limits(parser: argparse.ArgumentParser) -> None:
    """The HTTP port's timeouts and connection cap (http_bridge/_http_server.py)."""
    defaults = serving.HttpLimits()
    parser.add_argument("--http-header-timeout", type=_positive_number(float), default=defaults.header_timeout_s,
                        metavar="SECONDS",
                        help="seconds a connection may take to send a request head (and stay idle between requests)")
    parser.add_argument("--http-body-timeout", type=_positive_number(float), default=defaults.body_timeout_s,
                        metavar="SECONDS",
                        help="seconds a request body may take to arrive")
    parser.add_argument("--http-max-connections", type=_positive_number(int), default=None, metavar="N",
                        help="open HTTP connections at most (default: 3/4 of the file descriptor limit, "
                             "at most 10,000); more are answered 503")


def _workers(value: str) -> int:
    try:
        return worker_count(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of workers (at least 1) or auto, got {value!r}") from None


def _add_browser_options(parser: argparse.ArgumentParser) -> None:
    """Which Host and Origin the HTTP and MCP doors serve (ors_grpc/protocol/browser_policy.py)."""
    parser.add_argument("--allowed-host", dest="allowed_hosts", action="append", default=[], metavar="NAME[:PORT]",
                        help="also serve requests whose Host is NAME (NAME:PORT: that port only; NAME:*: any port), "
                             "as behind a proxy; repeatable (default: bound to loopback, only 127.0.0.1, localhost "
                             "and [::1], so that web pages cannot reach the doors through DNS rebinding; bound "
                             "elsewhere, any)")
    parser.add_argument("--allowed-origin", dest="allowed_origins", action="append", default=[],
                        metavar="SCHEME://NAME[:PORT]",
                        help="let web pages served at this origin (SCHEME://NAME:*: any port) use the doors, with "
                             "CORS answers; repeatable (default: none: a page of another origin cannot change state)")


def _http_limits(args: argparse.Namespace) -> serving.HttpLimits:
    return serving.HttpLimits(header_timeout_s=args.http_header_timeout, body_timeout_s=args.http_body_timeout,
                              max_connections=args.http_max_connections)


async def _serve(args: argparse.Namespace) -> None:
    environments = [load_environment(spec) for spec in args.environments or [DEFAULT_ENVIRONMENT]]
    config = ServerConfig(
        session_timeout_s=args.session_timeout,
        max_message_bytes=args.max_message_bytes,
        api_key=args.api_key,
        max_sessions=args.max_sessions,
        tool_timeout_s=args.tool_timeout,
        warm_ttl_s=args.warm_ttl,
        warm_setup_timeout_s=args.warm_setup_timeout,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        setup_wait_s=args.setup_wait,
        drain_timeout_s=args.drain_timeout,
        advertise_host=args.advertise_host,
        workers=args.workers,
        worker_memory_limit_mib=args.worker_memory_limit,
        worker_stall_limit_s=args.worker_stall_limit,
        isolation=args.isolation,
        allowed_hosts=tuple(args.allowed_hosts),
        allowed_origins=tuple(args.allowed_origins),
    )
    toolsets = [load_toolset(spec) for spec in args.toolsets]
    await serving.serve(environments, host=args.host, port=args.port, http_port=args.http_port,
                        mcp_port=args.mcp_port, metrics_port=args.metrics_port, config=config, http_limits=_http_limits(args),
                        toolsets=toolsets)


async def _bridge(args: argparse.Namespace) -> None:
    options = serving.BridgeOptions(
        max_message_bytes=args.max_message_bytes, max_body_bytes=args.max_body_bytes,
        tls_cert=args.tls_cert, tls_key=args.tls_key,
        backend_tls_root_cert=args.backend_tls_root_cert, backend_tls_server_name=args.backend_tls_server_name,
        allowed_hosts=tuple(args.allowed_hosts), allowed_origins=tuple(args.allowed_origins),
    )
    http_port = args.http_port if args.http_port is not None or args.mcp_port is not None else DEFAULT_BRIDGE_HTTP_PORT
    await serving.bridge(args.backend, host=args.host, http_port=http_port, mcp_port=args.mcp_port,
                         metrics_port=args.metrics_port, options=options, http_limits=_http_limits(args))


async def _drain(args: argparse.Namespace) -> None:
    try:
        await serving.drain(args.target, api_key=args.api_key, wait=args.wait)
    except serving.DrainError as exc:
        print(f"ors-grpc drain: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)


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
    command = {"serve": _serve, "bridge": _bridge, "drain": _drain}[args.command]
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
    """Exit now if synchronous user code still runs in user-code threads.

    Every session is torn down by now; such a thread (a sync tool that
    ignores its episode's end) cannot be interrupted, and Python would wait
    for it at exit, so a stop signal would not stop the process.
    """
    stuck = busy_user_code_threads()
    if stuck:
        logger.warning("exiting_with_user_code_running threads=%d", stuck)
        logging.shutdown()
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
