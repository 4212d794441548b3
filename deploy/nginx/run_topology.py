"""Start the scale-out topology on loopback ports and keep it running.

    python deploy/nginx/run_topology.py --backends 3 [--bridges 1] [MODULE:CLASS ...]

K `ors-grpc serve` backends (each with `--metrics-port`), nginx as the gRPC
load balancer with session affinity on `x-session-id` (its configuration is
`ors-grpc.conf.template` beside this file, rendered into a scratch
directory), and one or more stateless `ors-grpc bridge --backend <nginx>` in
front. Every port is picked free on 127.0.0.1. It prints each process's
addresses, then runs until Ctrl-C or SIGTERM and stops everything.

Also a library: `Topology` (used by tests/deploy/test_scaleout.py and
bench/scaleout.py). nginx runs as a non-daemon child with its own pid file,
error log and temp paths in the scratch directory, so no privileges are
needed.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

if __package__ in (None, ""):  # run as a script: the repository root makes `deploy` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from deploy.processes import (  # noqa: E402
    HOST, REPO_ROOT, Backend, Bridge, Child, LoopbackTopology, free_port, render_template, run_until_stopped,
    start_backend, start_bridge, topology_parser,
)

__all__ = ["REPO_ROOT", "Topology", "find_nginx", "render_config"]

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "ors-grpc.conf.template"
DEFAULT_ENVIRONMENT = "ors_grpc.examples.arithmetic:Arithmetic"


def find_nginx() -> str | None:
    """The nginx binary: on PATH, else Debian's /usr/sbin/nginx (not on a user's PATH)."""
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    return found


def render_config(
    prefix: Path,
    listen_port: int,
    backend_targets: Sequence[str],
    *,
    access_log: str | None = None,
    max_body: str = "32m",
    connect_timeout: str = "1s",
    call_timeout: str = "1h",
) -> str:
    """The nginx configuration for these backends; `access_log` is a path (or None: off)."""
    servers = "\n".join(f"        server {target} max_fails=1 fail_timeout=5s;" for target in backend_targets)
    return render_template(TEMPLATE, {
        "PREFIX": str(prefix),
        "LISTEN": f"{HOST}:{listen_port}",
        "UPSTREAM_SERVERS": servers,
        "ACCESS_LOG": f"{access_log} ors_grpc" if access_log else "off",
        "MAX_BODY": max_body,
        "CONNECT_TIMEOUT": connect_timeout,
        "CALL_TIMEOUT": call_timeout,
    })


@dataclass
class Topology(LoopbackTopology):
    """K backends behind nginx behind B bridges, all on loopback. Use as a
    context manager (or `start()`/`stop()`); the scratch directory keeps every
    log and the rendered nginx.conf, and is removed on stop unless `keep_workdir`."""

    backends_count: int = 3
    bridges_count: int = 1
    environments: Sequence[str] = (DEFAULT_ENVIRONMENT,)
    serve_args: Sequence[str] = ()
    access_log: bool = True
    keep_workdir: bool = False
    workdir: Path = field(init=False)
    backends: list[Backend] = field(init=False, default_factory=list)
    bridges: list[Bridge] = field(init=False, default_factory=list)
    nginx: Child | None = field(init=False, default=None)
    nginx_target: str = field(init=False, default="")

    @property
    def bridge_urls(self) -> list[str]:
        return [bridge.http_url for bridge in self.bridges]

    def check_tools(self) -> None:
        if find_nginx() is None:
            raise RuntimeError("nginx is not installed (Debian: apt-get install -y nginx)")

    def start_backend(self, index: int) -> Backend:
        return start_backend(f"backend-{index}", self.environments, self.serve_args, self.workdir)

    def start_front(self) -> None:
        self._start_nginx(str(find_nginx()))
        for index in range(self.bridges_count):
            self.bridges.append(start_bridge(f"bridge-{index}", self.nginx_target, self.workdir))

    def _start_nginx(self, nginx: str) -> None:
        port = free_port()
        config = self.workdir / "nginx.conf"
        config.write_text(render_config(
            self.workdir, port, [backend.grpc_target for backend in self.backends],
            access_log=str(self.access_log_path) if self.access_log else None,
        ))
        # -e: the error log before the configuration is read (the compiled-in
        # default under /var/log is not writable unprivileged).
        self.nginx = Child("nginx", [nginx, "-p", str(self.workdir), "-c", str(config),
                                     "-e", str(self.workdir / "error.log")], self.workdir)
        self.nginx.start()
        self.nginx.wait_port(port)
        self.nginx_target = f"{HOST}:{port}"

    def front(self) -> list[Child]:
        """The bridges, then nginx (SIGTERM: its fast shutdown)."""
        return [bridge.child for bridge in self.bridges] + ([self.nginx] if self.nginx is not None else [])

    def describe(self) -> str:
        lines = [f"scratch directory: {self.workdir}"]
        for index, backend in enumerate(self.backends):
            lines.append(f"backend-{index}: gRPC {backend.grpc_target}, metrics {backend.metrics_url}, pid {backend.pid}")
        lines.append(f"nginx: gRPC {self.nginx_target}, config {self.workdir / 'nginx.conf'}")
        for index, bridge in enumerate(self.bridges):
            lines.append(f"bridge-{index}: HTTP {bridge.http_url}, metrics {bridge.metrics_url}")
        return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = topology_parser(__doc__.splitlines()[0], DEFAULT_ENVIRONMENT, "nginx.conf")
    parser.add_argument("--bridges", type=int, default=1, help="number of ors-grpc bridge processes (1)")
    args = parser.parse_args(argv)
    topology = Topology(args.backends, args.bridges, args.environments or (DEFAULT_ENVIRONMENT,),
                        keep_workdir=args.keep)
    return run_until_stopped(topology)


if __name__ == "__main__":
    sys.exit(main())
