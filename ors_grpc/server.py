"""Serving environments from Python: `Server` (the reference SDK's drop-in),
and `create_server` for a gRPC server inside your own event loop.

    server, port = await create_server([MyEnv], "127.0.0.1:0")
    ...
    await server.stop(grace)  # stops accepting calls, then ends every session

`in_process_channel(server)` is a channel onto that server for a client in
the same event loop (no socket).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Sequence

from ors_grpc import serving
from ors_grpc._runtime.grpc_server import RunningServer, ServerConfig, create_server
from ors_grpc._runtime.inprocess import InProcessChannel
from ors_grpc._runtime.service import ToolsetRegistry, environment_map, toolset_map
from ors_grpc.observability.log_lines import configure_logging
from ors_grpc._runtime.workers.startup import stop_a_script_serving_in_a_worker
from ors_grpc.authoring.environment import Environment
from ors_grpc.protocol.constants import API_KEY_METADATA_KEY

__all__ = ["API_KEY_METADATA_KEY", "RunningServer", "Server", "ServerConfig", "create_server", "in_process_channel"]


def in_process_channel(server: RunningServer) -> InProcessChannel:
    """A channel to `server`'s ORS service for a client in the same event loop
    (the doors of `ors-grpc serve`): same handlers and interceptors, no
    socket. `server` must come from `create_server`."""
    return server.in_process_channel


class Server:
    """Drop-in for the reference SDK's `ors.Server`: `Server([MyEnv]).run(port=8080)`.

    `run` serves the ORS HTTP API on `port` (through the HTTP bridge, so
    existing ORS clients work unchanged) and gRPC on `grpc_port`, until
    SIGINT, or until SIGTERM has drained it (`config.drain_timeout_s`; see
    docs/deployment.md, "Draining a backend"). The environments' code runs
    in worker processes, one per CPU, unless `config.workers` says
    otherwise (0: in this process; docs/deployment.md, "Worker processes").
    """

    def __init__(
        self,
        environments: Sequence[type[Environment]],
        return_errors: str = "exception",
        *,
        config: ServerConfig = ServerConfig(),
        toolsets: ToolsetRegistry = (),
    ) -> None:
        # Fail at construction, as the reference does, not when serving.
        environment_map(environments)
        toolset_map(toolsets)
        self.environments = list(environments)
        self.config = config
        self.toolsets = toolsets
        # Accepted for signature compatibility: errors always carry the
        # exception's message here (the reference's default).
        self.return_errors = return_errors

    def run(self, host: str = "0.0.0.0", port: int = 8080, *, grpc_port: int = 50051) -> None:
        """Serve until SIGINT or a drain (SIGTERM), then tear every session left down."""
        stop_a_script_serving_in_a_worker()  # a worker loading this script (no main guard) stops here
        if not logging.getLogger().handlers:
            configure_logging(logging.INFO)  # the lines `ors-grpc serve` and the workers write
        try:
            asyncio.run(serving.serve(self.environments, host=host, port=grpc_port, http_port=port,
                                      config=self.config, toolsets=self.toolsets))
        except serving.StartupError as exc:  # one line and status 2, as `ors-grpc serve` answers it
            print(f"ors-grpc: error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(serving.EXIT_STARTUP_ERROR) from None
