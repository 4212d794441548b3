"""Start and stop the servers under test, each in its own process, and read their memory."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"(gRPC|HTTP|MCP) listening on 127\.0\.0\.1:(\d+)")


def vm_rss_bytes(pid: int) -> int:
    """VmRSS of process `pid`, from /proc/PID/status (OSError once it ended)."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    kib = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert kib, status
    return int(kib.group(1)) * 1024


class ServerProcess:
    """A server subprocess whose stdout and stderr go to a temporary log file.

    A file (not a pipe) so that a chatty server never blocks on a full pipe and
    the benchmark needs no thread to drain it.
    """

    def __init__(self, name: str, argv: list[str], extra_env: dict[str, str] | None = None):
        self.name = name
        self.argv = argv
        self.extra_env = extra_env or {}
        #: Where the process runs (another checkout's tree serves that checkout's code).
        self.cwd = REPO_ROOT
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log", delete=False)

    def start(self, want: set[str], timeout: float = 30.0) -> "ServerProcess":
        """Start the process and wait until it has printed a port for every door in ``want``."""
        env = {**os.environ, **self.extra_env, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.argv, cwd=self.cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while not want <= self.ports.keys():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.tail()  # before `stop` removes the log
                self.stop()
                raise RuntimeError(f"{self.name} did not start: {tail}")
            time.sleep(0.05)
            for door, port in _LISTENING.findall(self.output()):
                self.ports[door] = int(port)
        return self

    def output(self) -> str:
        return pathlib.Path(self.log.name).read_text(errors="replace")

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def rss_bytes(self) -> int:
        """VmRSS of the server process."""
        assert self.proc is not None
        return vm_rss_bytes(self.proc.pid)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far (all its threads)."""
        assert self.proc is not None
        fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, grace: float = 10.0) -> None:
        """SIGINT (a stop at once: ors-grpc drains on SIGTERM), then SIGKILL
        after ``grace`` seconds; removes the log file."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        pathlib.Path(self.log.name).unlink(missing_ok=True)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def reference_server(quiet: bool = False) -> ServerProcess:
    """The reference ors-sdk server; ``quiet`` raises its log level to WARNING."""
    extra = {"ORS_LOG_LEVEL": "WARNING"} if quiet else {}
    return ServerProcess("reference", [sys.executable, "-m", "bench.ref_server"], extra)


def floor_server(kind: str) -> ServerProcess:
    """A floor server (``bench/floors.py``): bare aiohttp (``http``) or bare grpc.aio (``grpc``)."""
    return ServerProcess(f"floor-{kind}", [sys.executable, "-m", "bench.floors", kind])


def ours_server(http: bool, environment: str = "bench.env:BenchEnv", mcp: bool = False,
                serve_args: Sequence[str] = ()) -> ServerProcess:
    """``ors-grpc serve bench.env:BenchEnv`` (or `environment`) with or without the HTTP bridge (and the MCP
    door), and `serve_args` besides."""
    args = ["serve", environment, "--port", "0", *serve_args]
    if http:
        args += ["--http-port", "0"]
    if mcp:
        args += ["--mcp-port", "0"]
    script = shutil.which("ors-grpc", path=str(pathlib.Path(sys.executable).parent))
    if script:
        argv = [sys.executable, script, *args]
    else:
        argv = [sys.executable, "-c", "import sys; from ors_grpc.cli import main; sys.exit(main())", *args]
    return ServerProcess("ours-mcp" if mcp else "ours-http" if http else "ours-grpc", argv)


def run_load(door_kind: str, target: str, mode: str, timeout: float, **options) -> dict:
    """Run one ``bench.load`` process and return its JSON result."""
    argv = [sys.executable, "-m", "bench.load", "--door", door_kind, "--target", target, "--mode", mode]
    for name, value in options.items():
        argv += [f"--{name}", str(value)]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed: {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
