"""`ors-grpc serve --workers N`: environments' code runs in worker processes
the server supervises; an episode lives in one worker for its whole life.
Faults (crashes, kills, timeouts, memory, crash loops) are in `test_worker_faults.py`; the default
mode, and the classes workers load from the serving script, in `test_contained_by_default.py`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc._runtime.workers.hop import Hello, recv_frame
from ors_grpc.protocol.constants import STATUS_DETAILS_METADATA_KEY
from tests.support.bridge_http import read_sse
from tests.support.reliability_environments import MARKER_DIR_VARIABLE
from tests.support.reliability_helpers import grpc_call, grpc_episode, grpc_pid, grpc_stats, grpc_stub, http_episode
from tests.support.servers import ROOT, start_serve

pytestmark = pytest.mark.timeout(120)

WORKER_PROBE = "tests.support.worker_environments:WorkerProbeEnv"


def serve_workers(count: str, marker_dir: Path | None = None):
    env = {MARKER_DIR_VARIABLE: str(marker_dir)} if marker_dir else None
    return start_serve(WORKER_PROBE, "--http-port", "0", "--workers", count, env=env)


async def http_call(http: aiohttp.ClientSession, sid: str, name: str) -> dict:
    body = {"name": name, "input": {}}
    async with http.post("/workerprobeenv/call", json=body, headers={"X-Session-ID": sid}) as response:
        assert response.status == 200, await response.text()
        return (await read_sse(response)).result()


async def http_pid(http: aiohttp.ClientSession, sid: str) -> int:
    return (await http_call(http, sid, "pid"))["output"]["metadata"]["pid"]


async def test_episodes_live_in_worker_processes_spread_over_the_workers(tmp_path: Path) -> None:
    with serve_workers("2", marker_dir=tmp_path) as serve:
        async with grpc_stub(serve.grpc_target) as stub, aiohttp.ClientSession(base_url=serve.http_url) as http:
            first = await grpc_episode(stub, "first", env_name="workerprobeenv")
            second = await http_episode(http, "second", env_name="workerprobeenv")
            first_pid, second_pid = await grpc_pid(stub, first), await http_pid(http, second)
            assert serve.proc.pid not in (first_pid, second_pid)
            assert first_pid != second_pid  # the second episode went to the idle worker
            # An episode stays in its worker: its state is there.
            await grpc_call(stub, first, "echo_tag")
            assert await grpc_pid(stub, first) == first_pid
            assert (await grpc_stats(stub, first))["runs"] == {"echo_tag": 1}
            # Class-level calls run in a worker too.
            tasks = await stub.ListTasks(pb.ListTasksRequest(env_name="workerprobeenv", split="train"))
            assert len(tasks.tasks) == 3
            await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=first))
            async with http.post("/delete", headers={"X-Session-ID": second}) as response:
                assert response.status == 200, await response.text()
            # Teardown ran in the workers.
            assert sorted(path.name for path in tmp_path.iterdir()) == ["teardown-first", "teardown-second"]


def test_an_ors_error_raised_by_environment_code_crosses_the_hop_as_it_is() -> None:
    with start_serve("tests.support.crash_report_env:CrashReportEnv", "--workers", "1") as serve:
        with grpc.insecure_channel(serve.grpc_target) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            request = pb.CreateEpisodeRequest(session_id="reporter", env_name="crashreportenv")
            request.task_spec.json = "{}"
            stub.CreateEpisode(request, timeout=30)
            with pytest.raises(grpc.RpcError) as caught:  # its get_prompt raises ENVIRONMENT_CRASHED
                stub.GetPrompt(pb.GetPromptRequest(session_id="reporter"), timeout=30)
    assert caught.value.code() == grpc.StatusCode.ABORTED, caught.value.details()
    info = error_details_pb2.ErrorInfo()
    trailers = dict(caught.value.trailing_metadata())
    assert status_pb2.Status.FromString(trailers[STATUS_DETAILS_METADATA_KEY]).details[0].Unpack(info)
    assert (info.reason, dict(info.metadata)) == (
        "ERROR_REASON_ENVIRONMENT_CRASHED", {"cause": "signal", "signal": "SIGSEGV"})


def test_a_worker_started_while_the_hops_backlog_is_full_waits_its_turn_and_says_hello(tmp_path: Path) -> None:
    """A burst of starts (hundreds of episode processes at once) can fill the hop's listen backlog:
    a worker then waits for room and connects, where asyncio's own connect took the kernel's
    EAGAIN for a connection and died at its first write (ENOTCONN)."""
    path, log = str(tmp_path / "hop.sock"), tmp_path / "worker.log"
    with socket.socket(socket.AF_UNIX) as listener, log.open("wb") as stderr:
        listener.bind(path)
        listener.listen(0)
        waiting = _fill_backlog(path)
        worker = subprocess.Popen([sys.executable, "-m", "ors_grpc._runtime.workers.worker", path, "7",
                                   str(os.getpid())], cwd=ROOT, stderr=stderr)
        try:
            while worker.poll() is None and not _blocked_in_a_unix_connect(worker.pid):
                time.sleep(0.05)
            assert worker.poll() is None, log.read_text()
            listener.settimeout(60)
            for _ in waiting:  # room in the backlog, as the server's accepts make it
                listener.accept()[0].close()
            connection, _ = listener.accept()
            with connection:
                connection.settimeout(60)
                assert recv_frame(connection) == Hello(7, worker.pid)
        finally:
            worker.kill()
            worker.wait()


def _fill_backlog(path: str) -> list[socket.socket]:
    """Connections that fill the backlog of the listener at `path` (which accepts none yet)."""
    waiting: list[socket.socket] = []
    while True:
        attempt = socket.socket(socket.AF_UNIX)
        attempt.setblocking(False)
        try:
            attempt.connect(path)
        except BlockingIOError:
            attempt.close()
            return waiting
        waiting.append(attempt)


def _blocked_in_a_unix_connect(pid: int) -> bool:
    tasks = Path(f"/proc/{pid}/task")
    return any((task / "wchan").read_text() == "unix_wait_for_peer" for task in tasks.iterdir())
