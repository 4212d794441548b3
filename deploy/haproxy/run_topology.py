"""Start K `ors-grpc serve` backends behind HAProxy on loopback ports and keep it running.

    python deploy/haproxy/run_topology.py --backends 3 [--bridges 1] [MODULE:CLASS ...]

HAProxy balances the gRPC backends on `x-session-id` (consistent hash) and
keeps each id it has seen on its backend (a stick table), configured by
`haproxy.cfg.template` beside this file, rendered into a scratch directory.
Optional stateless `ors-grpc bridge` processes serve the HTTP door in front.
It prints each process's addresses, then runs until Ctrl-C or SIGTERM.

Also a library: `Topology` (tests/deploy/test_haproxy.py). HAProxy runs in
the foreground (`-db`) as a child, its pid file and runtime API socket
(`admin.sock`: `drain(index)`) in the scratch directory: no privileges needed.
"""

from __future__ import annotations

import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

if __package__ in (None, ""):  # run as a script: the repository root makes `deploy` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from deploy.processes import (  # noqa: E402
    HOST, Backend, Bridge, Child, LoopbackTopology, free_port, render_template, run_until_stopped, start_backend,
    start_bridge, topology_parser,
)

__all__ = ["Topology", "find_haproxy", "render_config"]

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "haproxy.cfg.template"
DEFAULT_ENVIRONMENT = "ors_grpc.examples.arithmetic:Arithmetic"
BACKEND_NAME = "ors_backends"


def find_haproxy() -> str | None:
    """The haproxy binary: on PATH, else Debian's /usr/sbin/haproxy (not on a user's PATH)."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


def server_name(index: int) -> str:
    return f"backend-{index}"


def render_config(
    prefix: Path,
    listen_port: int,
    backend_targets: Sequence[str],
    *,
    connect_timeout: str = "1s",
    call_timeout: str = "1h",
    session_expire: str = "1h",
) -> str:
    """The HAProxy configuration for these backends (`server backend-<i>` in order)."""
    servers = "\n".join(
        f"    server {server_name(index)} {target} proto h2 check inter 500ms fall 1 rise 1"
        for index, target in enumerate(backend_targets)
    )
    return render_template(TEMPLATE, {
        "PREFIX": str(prefix),
        "LISTEN": f"{HOST}:{listen_port}",
        "SERVERS": servers,
        "CONNECT_TIMEOUT": connect_timeout,
        "CALL_TIMEOUT": call_timeout,
        "SESSION_EXPIRE": session_expire,
    })


@dataclass
class Topology(LoopbackTopology):
    """K backends behind HAProxy behind B bridges, all on loopback; a context
    manager (or `start()`/`stop()`). The scratch directory keeps every log and
    the rendered haproxy.cfg, removed on stop unless `keep_workdir`."""

    backends_count: int = 3
    bridges_count: int = 0
    environments: Sequence[str] = (DEFAULT_ENVIRONMENT,)
    serve_args: Sequence[str] = ()
    keep_workdir: bool = False
    workdir: Path = field(init=False)
    backends: list[Backend] = field(init=False, default_factory=list)
    bridges: list[Bridge] = field(init=False, default_factory=list)
    haproxy: Child | None = field(init=False, default=None)
    haproxy_target: str = field(init=False, default="")
    workdir_prefix = "ors-haproxy-"

    @property
    def bridge_urls(self) -> list[str]:
        return [bridge.http_url for bridge in self.bridges]

    def check_tools(self) -> None:
        if find_haproxy() is None:
            raise RuntimeError("haproxy is not installed (Debian: apt-get install -y haproxy)")

    def start_backend(self, index: int) -> Backend:
        return start_backend(server_name(index), self.environments, self.serve_args, self.workdir)

    def start_front(self) -> None:
        port = free_port()
        config = self.workdir / "haproxy.cfg"
        config.write_text(render_config(self.workdir, port, [backend.grpc_target for backend in self.backends]))
        # -db: foreground, no daemon (the caller supervises it); -W is not needed for one process.
        self.haproxy = Child("haproxy", [str(find_haproxy()), "-db", "-f", str(config)], self.workdir)
        self.haproxy.start()
        self.haproxy.wait_port(port)
        self.haproxy_target = f"{HOST}:{port}"
        for index in range(self.bridges_count):
            self.bridges.append(start_bridge(f"bridge-{index}", self.haproxy_target, self.workdir))

    def runtime_api(self, command: str) -> str:
        """One command over HAProxy's runtime API (its admin socket); its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(self.workdir / "admin.sock"))
            conn.sendall(command.encode() + b"\n")
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        return answer.decode()

    def set_state(self, index: int, state: str) -> None:
        """`ready`, `drain` or `maint` for backend `index`, as an operator would before a restart."""
        answer = self.runtime_api(f"set server {BACKEND_NAME}/{server_name(index)} state {state}")
        if answer.strip():
            raise RuntimeError(f"haproxy refused state {state} for {server_name(index)}: {answer.strip()}")

    def server_states(self) -> dict[str, str]:
        """Each backend's administrative and operational state, as HAProxy's `show servers state` lists it."""
        lines = self.runtime_api(f"show servers state {BACKEND_NAME}").splitlines()
        header = next(line for line in lines if line.startswith("# be_id")).lstrip("# ").split()
        states = {}
        for line in lines:
            if line and not line.startswith("#") and len(line.split()) == len(header):
                row = dict(zip(header, line.split()))
                states[row["srv_name"]] = f"admin={row['srv_admin_state']} op={row['srv_op_state']}"
        return states

    def front(self) -> list[Child]:
        """The bridges, then HAProxy."""
        return [bridge.child for bridge in self.bridges] + ([self.haproxy] if self.haproxy is not None else [])

    def describe(self) -> str:
        lines = [f"scratch directory: {self.workdir}"]
        for index, backend in enumerate(self.backends):
            lines.append(f"{server_name(index)}: gRPC {backend.grpc_target}, pid {backend.pid}")
        lines.append(f"haproxy: gRPC {self.haproxy_target}, config {self.workdir / 'haproxy.cfg'}, "
                     f"runtime API {self.workdir / 'admin.sock'}")
        for index, bridge in enumerate(self.bridges):
            lines.append(f"bridge-{index}: HTTP {bridge.http_url}, metrics {bridge.metrics_url}")
        return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = topology_parser(__doc__.splitlines()[0], DEFAULT_ENVIRONMENT, "haproxy.cfg")
    parser.add_argument("--bridges", type=int, default=1, help="number of ors-grpc bridge processes (1)")
    args = parser.parse_args(argv)
    topology = Topology(args.backends, args.bridges, args.environments or (DEFAULT_ENVIRONMENT,),
                        keep_workdir=args.keep)
    return run_until_stopped(topology)


if __name__ == "__main__":
    sys.exit(main())
