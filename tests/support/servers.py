"""Test helper: run `ors-grpc serve` as a subprocess on free loopback ports.

    with start_serve("tests.support.environments:EchoEnv", "--http-port", "0") as serve:
        serve.grpc_target   # "127.0.0.1:PORT"
        serve.http_url      # "http://127.0.0.1:PORT" (with --http-port)

`--port 0` is always passed; add `--http-port 0` to get the HTTP door too.
On exit the process gets SIGINT (a stop at once; SIGTERM drains), then SIGKILL if it lingers.
`run_cli_logging_to(log, ...)` runs any subcommand at DEBUG with its output in a file;
`start_script_server(script)` runs another server (openreward's, ors-sdk's) from a script.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"^(gRPC|HTTP|MCP) listening on (\S+):(\d+)$")
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class ServeProcess:
    """A running `ors-grpc serve` subprocess and its addresses."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.grpc_target: str | None = None
        self.http_url: str | None = None
        #: The MCP door's base URL (`http://HOST:PORT`), with `--mcp-port`.
        self.mcp_url: str | None = None
        #: stdout lines after the listening lines (read in the background).
        self.lines: "queue.Queue[str | None]" = queue.Queue()

    def stop(self, signum: int = signal.SIGINT) -> int:
        """`signum`, then SIGKILL after a while; the exit status (see `stop_process`)."""
        return stop_process(self.proc, signum)


def stop_process(proc: subprocess.Popen, signum: int = signal.SIGINT) -> int:
    """`signum`, then SIGKILL after a while; the exit status. SIGINT by
    default: it stops `serve` at once, where SIGTERM would drain it first
    (serving the open episodes until they end)."""
    if proc.poll() is None:
        proc.send_signal(signum)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _pump(stream, lines: "queue.Queue[str | None]") -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


@contextmanager
def start_serve(*args: str, env: Mapping[str, str] | None = None, stderr: Any = None,
                startup_timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[ServeProcess]:
    """Start `python -m ors_grpc.cli serve --port 0 *args` and wait until it
    listens (`startup_timeout_s` at most between its lines); its stderr goes to
    `stderr` (a file), else to the test's."""
    process_env = {**os.environ, **(env or {})}
    process_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), process_env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "ors_grpc.cli", "serve", "--port", "0", *args, *extra_serve_args(args)]
    with run_serve(command, cwd=ROOT, env=process_env, stderr=stderr, startup_timeout_s=startup_timeout_s) as serve:
        yield serve


@contextmanager
def run_serve(command: Sequence[str], *, cwd: Path, env: Mapping[str, str],
              stderr: Any = None, startup_timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[ServeProcess]:
    """Start a `serve` `command` (any `ors-grpc serve`, as from another virtualenv)
    and wait until it listens on the doors it asks for; stop it after."""
    wants_http, wants_mcp = "--http-port" in command, "--mcp-port" in command
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1)
    serve = ServeProcess(proc)
    threading.Thread(target=_pump, args=(proc.stdout, serve.lines), daemon=True).start()
    try:
        _wait_listening(serve, wants_http, wants_mcp, startup_timeout_s)
        yield serve
    finally:
        serve.stop()


def _wait_listening(serve: ServeProcess, wants_http: bool, wants_mcp: bool = False,
                    startup_timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    while serve.grpc_target is None or (wants_http and serve.http_url is None) or (
            wants_mcp and serve.mcp_url is None):
        try:
            line = serve.lines.get(timeout=startup_timeout_s)
        except queue.Empty:
            raise RuntimeError("ors-grpc serve did not start listening in time") from None
        if line is None:
            raise RuntimeError(f"ors-grpc serve exited with status {serve.proc.wait()}")
        match = LISTENING.match(line)
        if match is None:
            continue
        door, host, port = match.groups()
        if door == "gRPC":
            serve.grpc_target = f"{host}:{port}"
        elif door == "MCP":
            serve.mcp_url = f"http://{host}:{port}"
        else:
            serve.http_url = f"http://{host}:{port}"


@contextmanager
def start_bridge(backend_target: str, *args: str, env: Mapping[str, str] | None = None) -> Iterator[ServeProcess]:
    """Start `python -m ors_grpc.cli bridge --backend TARGET --http-port 0 *args`; wait until it listens."""
    process_env = {**os.environ, **(env or {})}
    process_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), process_env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ors_grpc.cli", "bridge", "--backend", backend_target, "--http-port", "0", *args],
        cwd=ROOT, env=process_env, stdout=subprocess.PIPE, text=True, bufsize=1,
    )
    bridge = ServeProcess(proc)
    threading.Thread(target=_pump, args=(proc.stdout, bridge.lines), daemon=True).start()
    try:
        # Only the HTTP door: mark the gRPC one as the backend's.
        bridge.grpc_target = backend_target
        _wait_listening(bridge, wants_http=True, wants_mcp="--mcp-port" in args)
        yield bridge
    finally:
        bridge.stop()


#: `serve`'s options that choose where environments' code runs, and how many values each takes.
PLACEMENT_OPTIONS = {"--workers": 1, "--in-process": 0, "--isolation": 1}


def extra_serve_args(own: Sequence[str] = ()) -> list[str]:
    """`ORS_TEST_SERVE_ARGS`, split: arguments every `serve` started here gets
    too, to run the tests again in another mode (`--in-process`, `--workers 2`,
    `--isolation episode`). A test whose own arguments `own` choose where the
    code runs keeps its choice: the mode's placement options are left out."""
    extra = os.environ.get("ORS_TEST_SERVE_ARGS", "").split()
    if not any(arg in PLACEMENT_OPTIONS for arg in own):
        return extra
    kept, skip = [], 0
    for arg in extra:
        if skip:
            skip -= 1
        elif arg in PLACEMENT_OPTIONS:
            skip = PLACEMENT_OPTIONS[arg]
        else:
            kept.append(arg)
    return kept


@contextmanager
def run_cli_logging_to(log: Path, *arguments: str) -> Iterator[dict[str, str]]:
    """`python -m ors_grpc.cli --log-level DEBUG ARGUMENTS`, stdout and stderr both in `log` (for
    tests that read what it logs). Yields the doors it announced, {"gRPC": "host:port", "HTTP":
    "host:port"}, once it listens on all of them (two for `serve --http-port`, else one), and
    the process id as "pid"."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with log.open("w") as output:
        extra = extra_serve_args(arguments) if arguments[0] == "serve" else []
        proc = subprocess.Popen([sys.executable, "-m", "ors_grpc.cli", "--log-level", "DEBUG", *arguments, *extra],
                                cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)
    try:
        wanted = 2 if arguments[0] == "serve" and "--http-port" in arguments else 1
        yield {**_logged_doors(proc, log, arguments[0], wanted), "pid": str(proc.pid)}
    finally:
        stop_process(proc)


def _logged_doors(proc: subprocess.Popen, log: Path, command: str, wanted: int) -> dict[str, str]:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        doors = {m.group(1): f"{m.group(2)}:{m.group(3)}" for line in log.read_text().splitlines()
                 if (m := LISTENING.match(line))}
        if len(doors) >= wanted:
            return doors
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(f"ors-grpc {command} did not start listening in time")


#: The end of a `python -c` script that has made `server` (openreward's or ors-sdk's `Server`,
#: with `os`, `socket` and `uvicorn` imported): serves `server.app` on a free loopback port,
#: announced like `ors-grpc serve`, for `start_script_server`.
SERVE_APP_ON_A_FREE_PORT = """
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(128)
print(f"HTTP listening on 127.0.0.1:{sock.getsockname()[1]}", flush=True)
# Nobody reads on after this line: send the server's logs nowhere.
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
uvicorn.Server(uvicorn.Config(server.app, log_level="warning")).run(sockets=[sock])
"""


@contextmanager
def start_script_server(script: str, *args: str, name: str, workdir: Path = ROOT) -> Iterator[str]:
    """`python -c SCRIPT ARGS` in `workdir` (importable), a server that announces its HTTP port
    like `ors-grpc serve` (a script ending in SERVE_APP_ON_A_FREE_PORT); yields its URL.
    `name` says which server did not start."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=workdir, env={**os.environ, "PYTHONPATH": str(workdir)},
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("HTTP listening on "), f"{name} did not start: {line!r}"
        yield "http://" + line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(15)
