"""The `ors-grpc` command: `serve` environments over gRPC (and HTTP), or run only the `bridge`.

    ors-grpc serve [MODULE:CLASS | PATH.py:CLASS ...] [--host H] [--port P] [--http-port P] ...
    ors-grpc bridge --backend HOST:PORT [--host H] [--http-port P]
    ors-grpc drain HOST:PORT [--wait]

Both take `--metrics-port P` to serve Prometheus metrics at /metrics; `--help` lists every option by group
(`ors_grpc.loading` finds the environments).

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
import logging
import math
import os
import sys
import textwrap
from typing import Any, Callable, NoReturn, Sequence

# gRPC's fork handlers (on by default in the C core) cannot serve a grpc.aio
# server, and an environment's forked children never use the parent's gRPC:
# off, unless the user says otherwise, before grpc is first imported. With
# them on, every fork of an environment logs "skipping fork() handlers".
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from ors_grpc import __version__, serving  # noqa: E402  (after the fork-support setting)
from ors_grpc._runtime.event_loop import fastest_event_loop  # noqa: E402
from ors_grpc._runtime.grpc_server import ServerConfig  # noqa: E402
from ors_grpc._runtime.user_code import busy_user_code_threads  # noqa: E402
from ors_grpc._runtime.workers.connection import KILL_GRACE_S  # noqa: E402
from ors_grpc._runtime.workers.placement import worker_count  # noqa: E402
from ors_grpc._runtime.workers.watchdog import DEFAULT_STALL_LIMIT_S  # noqa: E402
from ors_grpc.loading import environment_sources, load_environments, load_toolset  # noqa: E402
from ors_grpc.observability.log_lines import configure_logging  # noqa: E402
from ors_grpc.protocol.constants import (  # noqa: E402
    API_KEY_HEADER,
    API_KEY_METADATA_KEY,
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

    # Lines break at spaces only: never inside `--tool-timeout` or `in-process`.
    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)

    # A description or epilog: each line filled on its own, keeping its indentation.
    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            inner = indent + line[:len(line) - len(line.lstrip())]
            lines += textwrap.wrap(line.strip(), width, initial_indent=inner, subsequent_indent=inner,
                                   break_on_hyphens=False, break_long_words=False) or [""]
        return "\n".join(lines)


#: What the option groups of `serve --help` say about the modes environments' code runs in.
_MODES = ("--workers N (the default, auto: one per CPU): N supervised worker processes run it, an episode in "
          "one; --isolation episode: a process per episode; --in-process: the server process runs it")


def _parser() -> argparse.ArgumentParser:
    formatter = _HelpFormatter
    parser = _ArgumentParser(
        prog="ors-grpc", description="Open Reward Standard over gRPC.", formatter_class=formatter
    )
    log_level = {"type": str.upper, "choices": LOG_LEVELS, "metavar": "LEVEL"}
    levels = ", ".join(LOG_LEVELS)
    parser.add_argument("--log-level", default=DEFAULT_LOG_LEVEL, help=f"logging level on stderr: {levels}", **log_level)
    parser.add_argument("--version", action="version", version=f"ors-grpc {__version__}",
                        help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{serve,bridge,drain}")
    # Subcommand options too (`ors-grpc serve --log-level DEBUG`); SUPPRESS
    # keeps the main parser's value when it is not given here.
    sub_log_level = {
        "default": argparse.SUPPRESS, "help": f"logging level on stderr: {levels} (default: {DEFAULT_LOG_LEVEL})",
        **log_level,
    }
    _serve_parser(commands.add_parser(
        "serve", help="serve environments over gRPC (and HTTP with --http-port)", formatter_class=formatter,
        description="Serve environments over gRPC, the ORS HTTP/SSE API with --http-port and MCP with --mcp-port. "
                    f"Where environments' code runs: {_MODES}. SIGTERM drains (see --drain-timeout); SIGINT "
                    "(Ctrl-C), or a second signal, stops at once.",
        epilog=_sources_epilog(),
    ), sub_log_level)
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
    _bridge_parser(commands.add_parser(
        "bridge", help="serve only the HTTP/SSE bridge onto a gRPC backend", formatter_class=formatter,
        description="Serve the ORS HTTP/SSE API (and MCP with --mcp-port), translating each request onto a remote "
                    "gRPC backend (an `ors-grpc serve`, or a load balancer in front of several). It holds no "
                    "episode: environments' code and its limits are the backend's.",
    ), sub_log_level)
    return parser


def _serve_parser(serve: argparse.ArgumentParser, log_level: dict[str, Any]) -> None:
    code = serve.add_argument_group("environments' code", "What is served, and where its code runs.")
    code.add_argument("environments", nargs="*", metavar="ENV", default=[DEFAULT_ENVIRONMENT],
                      help="an environment to serve, as module.path:ClassName (the current directory is importable) "
                           "or path/to/file.py:ClassName, or SOURCE:SPEC of another ecosystem's environments (see "
                           "below); the first is the default one "
                           f"(default: {DEFAULT_ENVIRONMENT})")
    code.add_argument("--toolset", dest="toolsets", action="append", default=[], metavar="MODULE:CLASS",
                      help="register a Toolset that episodes may attach by name (toolset_name); as ENV, a module "
                           "or a file; repeatable (default: none)")
    placement = code.add_mutually_exclusive_group()
    placement.add_argument("--workers", type=_workers, default=None, metavar="N|auto",
                           help="run environments' code in N supervised worker processes (auto: one per CPU this "
                                "process may use), each episode in one for its whole life; a worker that crashes, "
                                "stalls or passes a limit is replaced and costs only its own episodes. A class "
                                "defined in the serving script is loaded from its file; one workers cannot load "
                                "(python -c, a REPL) is served in-process, saying so (default: auto)")
    placement.add_argument("--in-process", dest="workers", action="store_const", const=0,
                           help="run environments' code in the server process instead: for a debugger, or the "
                                "last sixth of trivial throughput; a crash or a blocked event loop then takes the "
                                "whole server with it")
    code.add_argument("--isolation", choices=["episode"], default=None,
                      help="episode: every episode in a process of its own that ends with it (a fault costs "
                           "exactly its episode), forked from a template that imported the environments, from a "
                           "pool of --workers (default 2) started processes (default: none: episodes share the "
                           "--workers)")

    doors = serve.add_argument_group(
        "doors", "Where clients reach the server: gRPC always, HTTP and MCP on request; every door binds --host and "
                 "shares --api-key, TLS and the browser rules.")
    doors.add_argument("--host", default="127.0.0.1", help="address every door binds (0.0.0.0: all interfaces)")
    doors.add_argument("--port", "--grpc-port", dest="port", type=_port, default=50051, metavar="PORT",
                       help="gRPC port (0: any free port)")
    doors.add_argument("--http-port", type=_port, metavar="PORT", default=None,
                       help="also serve the ORS HTTP/SSE API (the reference clients' door, the playground at /, "
                            "API docs at /docs) on this port (0: any free port) (default: no HTTP door)")
    doors.add_argument("--mcp-port", type=_port, metavar="PORT", default=None,
                       help="also serve MCP (streamable HTTP, /{env}/mcp/{session_id}) on this port (0: any free "
                            "port); needs the mcp extra (default: no MCP door)")
    doors.add_argument("--api-key", default=None,
                       help=f"require this key on every call but health: gRPC metadata {API_KEY_METADATA_KEY}, "
                            f"HTTP header {API_KEY_HEADER} or Authorization: Bearer (default: no key)")
    doors.add_argument("--tls-cert", default=None, metavar="FILE",
                       help="PEM certificate chain: serve TLS on every door (needs --tls-key) (default: plaintext)")
    doors.add_argument("--tls-key", default=None, metavar="FILE", help="PEM private key of --tls-cert")
    _add_browser_options(doors)

    limits = serve.add_argument_group(
        "limits", "What one client or one environment may take. Each applies the same in every mode unless its "
                  "help says otherwise; the server measures every time limit, outside environments' code.")
    limits.add_argument("--session-timeout", type=_positive_number(float), default=DEFAULT_SESSION_TIMEOUT_S,
                        metavar="SECONDS",
                        help="seconds without a call or ping after which a session's episode is ended and torn down")
    limits.add_argument("--max-sessions", type=_positive_number(int), default=None, metavar="N",
                        help="most episodes open (or prepared) at once; more are refused TOO_MANY_SESSIONS (HTTP "
                             "429). With --isolation episode also the most episode processes (default: no limit)")
    limits.add_argument("--tool-timeout", type=_positive_number(float), default=None, metavar="SECONDS",
                        help="seconds a tool call may run before its caller is answered 'tool call timed out' (the "
                             "session lives on). In-process it cannot stop the code: an async def tool is cancelled "
                             "at its next await, but sync code in a thread runs on until it returns (a hang holds "
                             "its thread for good), and code that holds the event loop (a blocking call in an async "
                             "def, sync code placed on the loop) delays the answer itself until it lets go. With "
                             "--workers the timer is in the server: the caller is answered on time, the call is "
                             f"cancelled in the worker, and a call still running {KILL_GRACE_S:g} s later gets its "
                             "worker killed and replaced (its episodes are lost, and say so). With --isolation "
                             "episode the same, costing only that episode (default: no limit)")
    limits.add_argument("--setup-wait", type=_positive_number(float), default=DEFAULT_SETUP_WAIT_S, metavar="SECONDS",
                        help="seconds a session call waits for the episode's setup() before answering 'still "
                             "starting' (HTTP 503, retried by the clients); setup() itself goes on")
    limits.add_argument("--max-message-bytes", type=_positive_number(int), default=DEFAULT_MAX_MESSAGE_BYTES,
                        metavar="BYTES", help="largest gRPC message and HTTP body, either way (HTTP 413 over it)")
    limits.add_argument("--worker-memory-limit", type=_positive_number(float), default=None, metavar="MIB",
                        help="with --workers or --isolation: a process whose resident memory passes MIB (read "
                             "every second) is killed and replaced, before the machine's OOM killer picks one (its "
                             "episodes are lost, and say so). In-process no limit applies (default: no limit)")
    limits.add_argument("--worker-stall-limit", type=_non_negative_number, default=DEFAULT_STALL_LIMIT_S,
                        metavar="SECONDS",
                        help="with --workers or --isolation: a process whose event loop one piece of code holds for "
                             "SECONDS (a blocking call in an async def, a spin), or that stops reporting for as long "
                             "(a frozen process), is killed and replaced (its episodes are lost, and say so), with "
                             "or without --tool-timeout; 0: never. Load slows a loop but never holds it: the default "
                             "is far above anything load makes. In-process a held loop freezes every episode; the "
                             "server logs a WARNING naming the code")
    _add_http_limits(limits)

    fleet = serve.add_argument_group(
        "fleet", "Running several servers behind a load balancer: draining for a rolling deploy, and episodes "
                 "prepared ahead (PrepareEpisodes, /{env}/prepare) for a /create to claim.")
    fleet.add_argument("--drain-timeout", type=_non_negative_number, default=DEFAULT_DRAIN_TIMEOUT_S,
                       metavar="SECONDS",
                       help="after SIGTERM (or `ors-grpc drain`), seconds the open episodes are served, health "
                            "NOT_SERVING and new episodes refused, before they are ended and the server exits "
                            "(0: at once); SIGINT or a second signal stops at once")
    fleet.add_argument("--advertise-host", default=None, metavar="HOST",
                       help="hand out session ids that name HOST and the door's port (this backend's address as "
                            "the proxy in front knows it: Envoy's stateful sessions route them back here; "
                            "docs/deployment.md) (default: plain session ids)")
    fleet.add_argument("--warm-ttl", type=_positive_number(float), default=DEFAULT_WARM_TTL_S, metavar="SECONDS",
                       help="seconds an episode prepared ahead is held unclaimed once set up, then torn down")
    fleet.add_argument("--warm-setup-timeout", type=_positive_number(float), default=DEFAULT_WARM_SETUP_TIMEOUT_S,
                       metavar="SECONDS",
                       help="seconds a prepared episode's construction and setup() may take from its prepare, "
                            "then it is cancelled and torn down")

    observability = serve.add_argument_group(
        "observability", "Logs go to stderr; tracing is on when the OTEL_* environment asks for it "
                         "(docs/deployment.md).")
    observability.add_argument("--metrics-port", type=_port, metavar="PORT", default=None,
                               help="serve Prometheus /metrics on this port (0: any free port); worker processes "
                                    "are read from the server (default: no metrics door)")
    observability.add_argument("--log-level", **log_level)


def _bridge_parser(bridge: argparse.ArgumentParser, log_level: dict[str, Any]) -> None:
    backend = bridge.add_argument_group("backend", "The gRPC server every request is translated onto.")
    backend.add_argument("--backend", required=True, type=_backend_target, metavar="HOST:PORT",
                         help="the ors-grpc gRPC backend (or a load balancer in front of several)")
    backend.add_argument("--backend-tls-root-cert", default=None, metavar="FILE",
                         help="reach the backend over TLS, trusting this PEM root certificate (default: plaintext)")
    backend.add_argument("--backend-tls-server-name", default=None, metavar="NAME",
                         help="the name to check in the backend's certificate (default: the backend host)")

    doors = bridge.add_argument_group(
        "doors", "Where clients reach the bridge; API keys are passed on to the backend, which checks them.")
    doors.add_argument("--host", default="127.0.0.1", help="address every door binds (0.0.0.0: all interfaces)")
    doors.add_argument("--http-port", type=_port, metavar="PORT", default=None,
                       help="HTTP port (0: any free port; none when only --mcp-port is given) "
                            f"(default: {DEFAULT_BRIDGE_HTTP_PORT})")
    doors.add_argument("--mcp-port", type=_port, metavar="PORT", default=None,
                       help="also serve MCP (streamable HTTP, /{env}/mcp/{session_id}) on this port (0: any free "
                            "port); needs the mcp extra (default: no MCP door)")
    doors.add_argument("--tls-cert", default=None, metavar="FILE",
                       help="PEM certificate chain: serve HTTPS (needs --tls-key) (default: plaintext)")
    doors.add_argument("--tls-key", default=None, metavar="FILE", help="PEM private key of --tls-cert")
    _add_browser_options(doors)

    limits = bridge.add_argument_group(
        "limits", "What one client may send; the limits of environments' code are the backend's.")
    limits.add_argument("--max-message-bytes", type=_positive_number(int), default=DEFAULT_MAX_MESSAGE_BYTES,
                        metavar="BYTES", help="largest gRPC message either way (as serve's --max-message-bytes)")
    limits.add_argument("--max-body-bytes", type=_positive_number(int), default=None,
                        metavar="BYTES", help="largest HTTP request body, HTTP 413 over it (default: as "
                                              "--max-message-bytes)")
    _add_http_limits(limits)

    observability = bridge.add_argument_group("observability", "Logs go to stderr.")
    observability.add_argument("--metrics-port", type=_port, metavar="PORT", default=None,
                               help="serve Prometheus /metrics on this port (0: any free port) "
                                    "(default: no metrics door)")
    observability.add_argument("--log-level", **log_level)


#: How each environment source of ors_grpc/adapters reads its SPEC (`serve --help`; docs/ecosystems.md).
SOURCE_SYNTAX = {
    "reasoning-gym": ("reasoning-gym:DATASET[+DATASET...][,...][?split=NAME:SIZE:SEED&...&PARAM=VALUE...]",
                      "reasoning-gym datasets: one environment per comma, `+` mixes datasets into one, PARAMs "
                      "configure them (difficulty); e.g. reasoning-gym:leg_counting,basic_arithmetic?split=train:1000:0"),
    "openenv": ("openenv:MODULE:CLASS[?...] | openenv:URL[?...]",
                "an OpenEnv Environment (or MCPEnvironment) class hosted here, or a running OpenEnv server fronted; "
                "options split=NAME:SIZE:SEED (repeatable), name=NAME"),
}


def _sources_epilog() -> str:
    lines = ["environment sources, each with the extra of its name (pip install '.[NAME]' from the checkout; "
             "docs/ecosystems.md):"]
    for name in sorted(environment_sources()):
        usage, explanation = SOURCE_SYNTAX.get(name, (f"{name}:SPEC", "a source another package installed"))
        lines += [f"  {usage}", f"      {explanation}"]
    return "\n".join(lines)


def _add_http_limits(parser: Any) -> None:
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


def _add_browser_options(parser: Any) -> None:
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
    environments = [cls for spec in args.environments or [DEFAULT_ENVIRONMENT] for cls in load_environments(spec)]
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "serve" and args.isolation and args.workers == 0:
        parser.error("argument --isolation: not allowed with argument --in-process")
    configure_logging(args.log_level)
    command = {"serve": _serve, "bridge": _bridge, "drain": _drain}[args.command]
    try:
        with asyncio.Runner(loop_factory=fastest_event_loop()) as runner:
            runner.run(command(args))
    except StartupError as exc:
        print(f"ors-grpc {args.command}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_STARTUP_ERROR)
    _exit_despite_stuck_user_code()


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
