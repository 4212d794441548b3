"""What the loopback topologies (deploy/nginx, deploy/envoy) share: free ports,
supervised child processes with log files, `ors-grpc serve` backends, templates.

Every process binds 127.0.0.1; every port is picked free. A child's output goes
to a log file in the topology's scratch directory (a file, not a pipe: a chatty
child never blocks, and the log stays for a post-mortem).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

__all__ = [
    "HOST", "REPO_ROOT", "Backend", "Child", "LoopbackTopology", "free_port", "python_cli", "render_template",
    "start_backend", "topology_parser", "wait_for_stop_signal",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"^(gRPC|HTTP|metrics) listening on (\S+):(\d+)$", re.MULTILINE)
STARTUP_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
HOST = "127.0.0.1"


def free_port() -> int:
    """A port the OS calls free now (a proxy cannot bind port 0 and report it)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def render_template(template: Path, values: Mapping[str, str]) -> str:
    """`template` with every `{{NAME}}` replaced by `values[NAME]`; an unfilled one is an error."""
    text = template.read_text()
    for name, value in values.items():
        text = text.replace("{{" + name + "}}", value)
    leftover = re.search(r"\{\{\w+\}\}", text)
    if leftover:
        raise ValueError(f"unfilled placeholder {leftover.group(0)} in {template}")
    return text


def python_cli(*args: str) -> list[str]:
    """The `ors-grpc` command run by this interpreter."""
    return [sys.executable, "-m", "ors_grpc.cli", *args]


class Child:
    """A child process whose output goes to `<name>.log` in the scratch directory."""

    def __init__(self, name: str, argv: list[str], workdir: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        with open(self.log_path, "wb") as log:
            # Own session: a Ctrl-C in the terminal reaches only us, and we stop children in order.
            self.proc = subprocess.Popen(self.argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def wait_listening(self, doors: set[str], timeout: float = STARTUP_TIMEOUT_S) -> dict[str, int]:
        """The ports this child announced (`<door> listening on HOST:PORT`), once all of `doors` are."""
        deadline = time.monotonic() + timeout
        while True:
            ports = {door: int(port) for door, _, port in LISTENING.findall(self.log_path.read_text(errors="replace"))}
            if doors <= ports.keys():
                return ports
            self._check_alive(deadline)
            time.sleep(0.05)

    def wait_port(self, port: int, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Until something accepts connections on `port` (for a proxy, which prints nothing)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                return
            except OSError:
                self._check_alive(deadline)
                time.sleep(0.05)

    def _check_alive(self, deadline: float) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with status {self.proc.returncode}:\n{self.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{self.name} did not start in time:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, grace: float = STOP_GRACE_S) -> None:
        """Send `sig` (SIGKILL: a crash), wait; SIGKILL if it lingers past `grace`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Backend:
    """One `ors-grpc serve` process; `http_target` is set when it serves the HTTP door too."""

    child: Child
    grpc_target: str
    metrics_url: str
    http_target: str | None = None

    @property
    def pid(self) -> int:
        return self.child.pid


def start_backend(name: str, environments: Sequence[str], serve_args: Sequence[str], workdir: Path,
                  *, http_door: bool = False, like: Backend | None = None) -> Backend:
    """Starts `ors-grpc serve` on free ports (and `--http-port` when `http_door`), or on the
    ports of `like` (its replacement: a proxy's static configuration names them); returns once it listens."""

    def port(target: str | None) -> str:
        return target.rpartition(":")[2] if like is not None and target else "0"

    metrics = like.metrics_url.rpartition(":")[2].partition("/")[0] if like is not None else "0"
    doors = ["--http-port", port(like.http_target if like else None)] if http_door else []
    child = Child(name, python_cli(
        "serve", *environments, "--host", HOST, "--port", port(like.grpc_target if like else None),
        "--metrics-port", metrics, *doors, *serve_args,
    ), workdir)
    child.start()
    ports = child.wait_listening({"gRPC", "metrics", *(["HTTP"] if http_door else [])})
    return Backend(child, f"{HOST}:{ports['gRPC']}", f"http://{HOST}:{ports['metrics']}/metrics",
                   f"{HOST}:{ports['HTTP']}" if http_door else None)


class LoopbackTopology:
    """What the topologies share: `backends`, the processes in front of them
    (`front()`, stopped first), a scratch directory kept on stop only with
    `keep_workdir`; a context manager around `start()` / `stop()`."""

    backends_count: int
    backends: list[Backend]
    workdir: Path
    keep_workdir: bool
    workdir_prefix = "ors-topology-"

    @property
    def access_log_path(self) -> Path:
        return self.workdir / "access.log"

    def start(self) -> "LoopbackTopology":
        """The backends, then what is in front of them; everything stopped again if one fails."""
        self.check_tools()
        self.workdir = Path(tempfile.mkdtemp(prefix=self.workdir_prefix))
        # A proxy's workers may run as another user (nginx started as root): let them in.
        self.workdir.chmod(0o755)
        try:
            for index in range(self.backends_count):
                self.backends.append(self.start_backend(index))
            self.start_front()
        except BaseException:
            self.stop()
            raise
        return self

    def check_tools(self) -> None:
        """RuntimeError, saying how to install it, when the proxy is missing."""
        raise NotImplementedError

    def start_backend(self, index: int) -> Backend:
        raise NotImplementedError

    def start_front(self) -> None:
        """Starts the processes in front of the backends."""
        raise NotImplementedError

    def front(self) -> list[Child]:
        """The processes in front of the backends, in the order they are stopped."""
        raise NotImplementedError

    def describe(self) -> str:
        """Every process's addresses, one per line, for a person running the topology."""
        raise NotImplementedError

    def kill_backend(self, index: int) -> None:
        """SIGKILL backend `index`: a crash, its sessions are lost."""
        self.backends[index].child.stop(signal.SIGKILL)

    def stop(self) -> None:
        """The front processes, then the backends (each gracefully, SIGKILL if stuck)."""
        for child in self.front():
            child.stop()
        for backend in self.backends:
            backend.child.stop(signal.SIGINT)  # at once: SIGTERM would drain the episodes still open
        if not self.keep_workdir and hasattr(self, "workdir"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def topology_parser(description: str, default_environment: str, config: str) -> argparse.ArgumentParser:
    """The options every run_topology.py takes: environments, --backends, --keep."""
    parser = argparse.ArgumentParser(prog="run_topology.py", description=description)
    parser.add_argument("environments", nargs="*", metavar="ENV",
                        help=f"module.path:ClassName for every backend (default {default_environment})")
    parser.add_argument("--backends", type=int, default=3, help="number of ors-grpc serve backends (3)")
    parser.add_argument("--keep", action="store_true", help=f"keep the scratch directory (logs, {config})")
    return parser


@dataclass
class Bridge:
    """One `ors-grpc bridge` process in front of a proxy."""

    child: Child
    http_url: str
    metrics_url: str


def start_bridge(name: str, backend_target: str, workdir: Path) -> Bridge:
    """Starts `ors-grpc bridge --backend backend_target` on free ports; returns once it listens."""
    child = Child(name, python_cli(
        "bridge", "--backend", backend_target, "--host", HOST, "--http-port", "0", "--metrics-port", "0",
    ), workdir)
    child.start()
    ports = child.wait_listening({"HTTP", "metrics"})
    return Bridge(child, f"http://{HOST}:{ports['HTTP']}", f"http://{HOST}:{ports['metrics']}/metrics")


def run_until_stopped(topology: LoopbackTopology) -> int:
    """A run_topology.py script's life: start `topology`, print its addresses, serve until
    SIGINT or SIGTERM, stop everything."""
    with topology:
        print(topology.describe(), flush=True)
        print("running; Ctrl-C stops everything", flush=True)
        wait_for_stop_signal()
    return 0


def wait_for_stop_signal() -> None:
    """Blocks until SIGINT or SIGTERM."""
    stop = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.append(True))
    while not stop:
        signal.pause()
