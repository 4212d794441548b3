"""The `ors-grpc` command: `serve` environments over gRPC (and HTTP), or run only the `bridge`.

    ors-grpc serve [MODULE:CLASS ...] [--host H] [--port P] [--http-port P] ...
    ors-grpc bridge --backend HOST:PORT [--host H] [--http-port P]

Both take `--metrics-port P` to serve Prometheus metrics at /metrics.

Each door prints `gRPC listening on HOST:PORT` / `HTTP listening on HOST:PORT`
(then `metrics listening on HOST:PORT`) once it accepts connections (port 0 picks a free port). SIGINT and SIGTERM
stop gracefully: no new work, every session torn down, exit status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import ssl
import sys
from typing import Any, Callable, Sequence

__all__ = ["main"]

DEFAULT_ENVIRONMENT = "ors_grpc.examples.arithmetic:Arithmetic"
DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# Seconds running RPCs get to finish after a stop signal.
SHUTDOWN_GRACE_S = 5.0

logger = logging.getLogger("ors_grpc.cli")


def load_environment(spec: str) -> type:
    """Import `module.path:ClassName` (the current directory is importable)."""
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise SystemExit(f"environment must look like module.path:ClassName, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"cannot import {module_name!r}: {exc}") from None
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise SystemExit(f"module {module_name!r} has no attribute {class_name!r}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ors-grpc", description="Open Reward Standard over gRPC.")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve environments over gRPC (and HTTP with --http-port)")
    serve.add_argument("environments", nargs="*", metavar="ENV",
                       help=f"module.path:ClassName; the first is the default (default {DEFAULT_ENVIRONMENT})")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", "--grpc-port", dest="port", type=int, default=50051, help="gRPC port")
    serve.add_argument("--http-port", type=int, default=None, help="also serve the HTTP/SSE bridge on this port")
    serve.add_argument("--api-key", default=None, help="require this x-api-key on every call but health")
    serve.add_argument("--session-timeout", type=float, default=900.0, help="seconds before an idle session is reaped")
    serve.add_argument("--max-sessions", type=int, default=None)
    serve.add_argument("--tool-timeout", type=float, default=None, help="seconds a tool call may run")
    serve.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES)
    serve.add_argument("--tls-cert", default=None, help="PEM certificate chain file")
    serve.add_argument("--tls-key", default=None, help="PEM private key file")
    serve.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")
    serve.add_argument("--toolset", dest="toolsets", action="append", default=[], metavar="MODULE:CLASS",
                       help="register a Toolset that episodes may attach by name (toolset_name); repeatable")
    serve.add_argument("--setup-wait", type=float, default=25.0,
                       help="seconds a session call waits for setup before answering 'still starting' (503)")

    bridge = commands.add_parser("bridge", help="serve only the HTTP/SSE bridge onto a gRPC backend")
    bridge.add_argument("--backend", required=True, metavar="HOST:PORT")
    bridge.add_argument("--host", default="127.0.0.1")
    bridge.add_argument("--http-port", type=int, default=8080)
    bridge.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES)
    bridge.add_argument("--tls-cert", default=None, help="PEM certificate chain file: serve HTTPS")
    bridge.add_argument("--tls-key", default=None, help="PEM private key file")
    bridge.add_argument("--backend-tls-root-cert", default=None, metavar="FILE",
                        help="reach the backend over TLS, trusting this PEM root certificate")
    bridge.add_argument("--backend-tls-server-name", default=None,
                        help="the name to check in the backend's certificate (default: the backend host)")
    bridge.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")
    return parser


def _announce(door: str, host: str, port: int) -> None:
    print(f"{door} listening on {host}:{port}", flush=True)


async def wait_for_stop_signal() -> None:
    """Return once SIGINT or SIGTERM arrives."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def _local_target(host: str, port: int) -> str:
    """Where a co-located client reaches a server bound to `host`."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"{host}:{port}"


async def _start_metrics(host: str, metrics_port: int | None) -> Any:
    """The Prometheus /metrics server when asked for, announced like the doors."""
    if metrics_port is None:
        return None
    from .metrics import start_metrics_server

    runner, bound_port = await start_metrics_server(host, metrics_port)
    _announce("metrics", host, bound_port)
    return runner


async def serve_until_signal(
    environments: Sequence[type], host: str, port: int, http_port: int | None, config: Any,
    metrics_port: int | None = None, *, toolsets: Any = (),
) -> None:
    """Serve gRPC (and the HTTP bridge on `http_port`) until SIGINT/SIGTERM,
    announcing each door on stdout; then stop gracefully. With TLS both
    doors serve it, from the same certificate and key."""
    from .server import create_server, in_process_channel

    server, bound_port = await create_server(environments, f"{host}:{port}", config=config, toolsets=toolsets)
    _announce("gRPC", host, bound_port)
    runner: Any = None
    metrics_runner: Any = None
    try:
        if http_port is not None:
            from http_bridge import start_bridge

            # Same process: the bridge calls the service without a socket.
            runner, bound_http_port = await start_bridge(
                _local_target(host, bound_port), host, http_port,
                channel=in_process_channel(server), max_body_bytes=config.max_message_bytes,
                ssl_context=_https_context(config.tls_cert, config.tls_key),
            )
            _announce("HTTP", host, bound_http_port)
        metrics_runner = await _start_metrics(host, metrics_port)
        await wait_for_stop_signal()
    finally:
        # All at once: an HTTP call waiting on a running tool ends when the
        # gRPC stop cancels its stream after the grace period; stopping HTTP
        # first would wait for it for aiohttp's shutdown timeout (60 s).
        runners = [r for r in (runner, metrics_runner) if r is not None]
        await asyncio.gather(*(r.cleanup() for r in runners), server.stop(SHUTDOWN_GRACE_S))
    logger.info("server_stopped")


def _https_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """A server TLS context from PEM files, or None without them."""
    if not cert and not key:
        return None
    if not (cert and key):
        raise SystemExit("TLS needs both --tls-cert and --tls-key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def _serve(args: argparse.Namespace) -> None:
    from .server import ServerConfig

    environments = [load_environment(spec) for spec in args.environments or [DEFAULT_ENVIRONMENT]]
    config = ServerConfig(
        session_timeout_s=args.session_timeout,
        max_message_bytes=args.max_message_bytes,
        api_key=args.api_key,
        max_sessions=args.max_sessions,
        tool_timeout_s=args.tool_timeout,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        setup_wait_s=args.setup_wait,
    )
    toolsets = [load_environment(spec) for spec in args.toolsets]
    await serve_until_signal(environments, args.host, args.port, args.http_port, config, args.metrics_port,
                             toolsets=toolsets)


async def _bridge(args: argparse.Namespace) -> None:
    from http_bridge import start_bridge

    runner, http_port = await start_bridge(
        args.backend, args.host, args.http_port, max_body_bytes=args.max_body_bytes,
        ssl_context=_https_context(args.tls_cert, args.tls_key),
        tls_root_cert=args.backend_tls_root_cert, tls_server_name=args.backend_tls_server_name,
    )
    _announce("HTTP", args.host, http_port)
    metrics_runner = None
    try:
        metrics_runner = await _start_metrics(args.host, args.metrics_port)
        await wait_for_stop_signal()
    finally:
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="time=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s",
    )
    command = _serve if args.command == "serve" else _bridge
    with asyncio.Runner(loop_factory=_fastest_event_loop()) as runner:
        runner.run(command(args))
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
