"""`ors-grpc serve --workers N`: environments' code runs in worker processes
the server supervises; an episode lives in one worker for its whole life."""

from __future__ import annotations

import functools

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import aiohttp
import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc.protocol.constants import ERROR_REASON_METADATA_KEY, STATUS_DETAILS_METADATA_KEY
from tests.support.reliability_environments import MARKER_DIR_VARIABLE
from tests.support.bridge_http import read_sse
from tests.support.reliability_helpers import (
    eventually, grpc_call, grpc_episode, grpc_stats, grpc_stub, http_episode, open_sessions,
)
from tests.support.servers import ROOT, start_serve
from tests.support.worker_environments import POISON_VARIABLE

pytestmark = pytest.mark.timeout(120)

WORKER_PROBE = "tests.support.worker_environments:WorkerProbeEnv"
#: How an episode whose worker ended answers: gRPC code, reason, HTTP status.
CRASHED = (grpc.StatusCode.ABORTED, "ERROR_REASON_ENVIRONMENT_CRASHED", 410)


def serve_workers(count: str, marker_dir: Path | None = None):
    env = {MARKER_DIR_VARIABLE: str(marker_dir)} if marker_dir else None
    return start_serve(WORKER_PROBE, "--http-port", "0", "--workers", count, env=env)


async def grpc_pid(stub, sid: str) -> int:
    events = await grpc_call(stub, sid, "pid")
    return json.loads(events[-1].result.output.metadata.json)["pid"]


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


async def refuses_prompts(stub, sid: str) -> bool:
    """Whether the episode's GetPrompt is refused now (its process is gone)."""
    try:
        await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
    except grpc.aio.AioRpcError:
        return True
    return False


async def grpc_crash_details(call) -> tuple[grpc.StatusCode, str, str, dict[str, str]]:
    """A call that fails: its code, reason, message and ErrorInfo metadata."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    error = caught.value
    trailers = dict(error.trailing_metadata() or ())
    status = status_pb2.Status.FromString(trailers[STATUS_DETAILS_METADATA_KEY])
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return error.code(), trailers[ERROR_REASON_METADATA_KEY], error.details(), dict(info.metadata)


async def test_a_worker_that_exits_fails_its_episodes_and_no_other() -> None:
    with serve_workers("2") as serve:
        async with grpc_stub(serve.grpc_target) as stub, aiohttp.ClientSession(base_url=serve.http_url) as http:
            doomed = await grpc_episode(stub, "doomed", env_name="workerprobeenv")
            healthy = await http_episode(http, "healthy", env_name="workerprobeenv")
            healthy_pid = await http_pid(http, healthy)
            # The call in flight fails naming the exit.
            events = await grpc_call(stub, doomed, "exit_process")
            assert "exited with status 3" in events[-1].failure.message
            # Every later call of the episode says so too; it never runs elsewhere.
            code, reason, message, metadata = await grpc_crash_details(
                stub.GetPrompt(pb.GetPromptRequest(session_id=doomed)))
            assert (code, reason) == CRASHED[:2]
            assert "exited with status 3" in message
            assert (metadata["cause"], metadata["exit_status"]) == ("exited", "3")
            # The episode in the other worker saw nothing.
            assert await http_pid(http, healthy) == healthy_pid
            assert (await http_call(http, healthy, "echo_tag"))["ok"] is True
            # The dead worker is replaced: new episodes land in a new process too, once it is up.

            async def a_new_worker_serves() -> bool:
                fresh = await grpc_episode(stub, "fresh", env_name="workerprobeenv")
                pid = await grpc_pid(stub, fresh)
                await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=fresh))
                return pid not in (healthy_pid, serve.proc.pid)

            await eventually(a_new_worker_serves, "a new worker in the dead one's place")


async def test_a_crashed_episode_answers_its_status_over_http() -> None:
    with serve_workers("1") as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http:
            sid = await http_episode(http, "doomed", env_name="workerprobeenv")
            body = {"name": "exit_process", "input": {}}
            async with http.post("/workerprobeenv/call", json=body, headers={"X-Session-ID": sid}) as response:
                stream = await read_sse(response)
            assert "exited with status 3" in stream.data("error")
            async with http.get("/workerprobeenv/prompt", headers={"X-Session-ID": sid}) as response:
                assert response.status == CRASHED[2]
                assert "the environment's worker process exited with status 3" in (await response.json())["detail"]


async def test_a_worker_killed_from_outside_is_named_by_its_signal() -> None:
    with serve_workers("1") as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            sid = await grpc_episode(stub, "killed", env_name="workerprobeenv")
            os.kill(await grpc_pid(stub, sid), signal.SIGKILL)

            await eventually(functools.partial(refuses_prompts, stub, sid), "the episode to answer that its worker is gone")
            code, reason, message, metadata = await grpc_crash_details(
                stub.GetPrompt(pb.GetPromptRequest(session_id=sid)))
            assert reason == CRASHED[1]
            assert "killed by SIGKILL" in message
            assert (metadata["cause"], metadata["signal"]) == ("signal", "SIGKILL")
            await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
            assert await open_sessions(stub) == 0


async def test_a_sync_tool_hanging_past_its_timeout_and_the_grace_gets_its_worker_replaced() -> None:
    with start_serve(WORKER_PROBE, "--workers", "1", "--tool-timeout", "1") as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            sid = await grpc_episode(stub, "hung", env_name="workerprobeenv")
            hung_pid = await grpc_pid(stub, sid)
            events = await grpc_call(stub, sid, "block_thread")
            assert events[-1].failure.message == "tool call timed out after 1s"
            # The thread cannot be stopped: after the grace its process is killed and replaced.

            async def replaced() -> bool:
                try:
                    fresh = await grpc_episode(stub, "fresh", env_name="workerprobeenv")
                except grpc.aio.AioRpcError:
                    return False  # no worker up yet
                return await grpc_pid(stub, fresh) != hung_pid

            await eventually(replaced, "the hung worker to be replaced")
            _, reason, message, metadata = await grpc_crash_details(
                stub.GetPrompt(pb.GetPromptRequest(session_id=sid)))
            assert reason == CRASHED[1] and (metadata["cause"], metadata["signal"]) == ("tool_timeout", "SIGKILL")
            assert "a tool call still ran past its timeout" in message


async def test_a_worker_over_the_memory_limit_is_killed_and_its_episode_says_why() -> None:
    with start_serve(WORKER_PROBE, "--workers", "1", "--worker-memory-limit", "200") as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            sid = await grpc_episode(stub, "hoarder", env_name="workerprobeenv")
            await grpc_call(stub, sid, "hoard_memory")  # answered (or failed) before the next reading

            await eventually(functools.partial(refuses_prompts, stub, sid), "the worker over the limit to be killed")
            _, reason, message, metadata = await grpc_crash_details(
                stub.GetPrompt(pb.GetPromptRequest(session_id=sid)))
            assert reason == CRASHED[1] and (metadata["cause"], metadata["signal"]) == ("memory_limit", "SIGKILL")
            assert "killed for going over its memory limit" in message
            # A new worker serves new episodes (meanwhile creations answer UNAVAILABLE, to be retried).

            async def served() -> bool:
                try:
                    fresh = await grpc_episode(stub, "fresh", env_name="workerprobeenv")
                except grpc.aio.AioRpcError as error:
                    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                    return False
                return (await grpc_call(stub, fresh, "echo_tag"))[-1].result.output.blocks[0].text.text == "fresh"

            await eventually(served, "a new worker to serve new episodes")


def test_environments_that_workers_cannot_import_fail_the_start_with_the_traceback() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "ors_grpc.cli", "serve", "tests.support.worker_only_failing_environment:WorkerShyEnv",
         "--port", "0", "--workers", "2"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 2, done.stderr
    assert "a worker process could not import the environments" in done.stderr
    assert "RuntimeError: no simulator licence in this process" in done.stderr


async def test_a_crash_loop_makes_health_not_serving_until_a_worker_starts_again(tmp_path: Path) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    poison = tmp_path / "poison"
    with start_serve(WORKER_PROBE, "--workers", "1", env={POISON_VARIABLE: str(poison)}) as serve:
        async with grpc.aio.insecure_channel(serve.grpc_target) as channel, grpc_stub(serve.grpc_target) as stub:
            health = health_pb2_grpc.HealthStub(channel)

            async def health_is(status: int) -> bool:
                return (await health.Check(health_pb2.HealthCheckRequest())).status == status

            sid = await grpc_episode(stub, "poisoner", env_name="workerprobeenv")
            await grpc_call(stub, sid, "poison_and_exit")
            await eventually(lambda: health_is(health_pb2.HealthCheckResponse.NOT_SERVING), "health NOT_SERVING")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await grpc_episode(stub, "meanwhile", env_name="workerprobeenv")
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # retry later
            poison.unlink()  # the environment can start again: a restart, after the backoff, succeeds
            await eventually(lambda: health_is(health_pb2.HealthCheckResponse.SERVING), "health SERVING again")
            fresh = await grpc_episode(stub, "fresh", env_name="workerprobeenv")
            assert (await grpc_call(stub, fresh, "echo_tag"))[-1].result.output.blocks[0].text.text == "fresh"


def test_the_server_killed_leaves_no_worker_behind_and_the_next_one_sweeps_its_hop_directory() -> None:
    with serve_workers("2") as serve:
        workers = _children(serve.proc.pid)
        assert len(workers) == 2
        serve.proc.kill()
        serve.proc.wait()
        for pid in workers:
            _wait_gone(pid)
    left = [path for path in Path(tempfile.gettempdir()).glob("ors-workers-*") if not (path / "hop.sock").exists()
            or not _listening(path / "hop.sock")]
    assert left  # SIGKILL gave the server no chance to remove its hop directory
    long_ago = time.time() - 3600
    for path in left:
        os.utime(path, (long_ago, long_ago))
    with serve_workers("1"):
        assert not any(path.exists() for path in left)


def _listening(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def test_an_environment_defined_in_main_cannot_be_served_by_workers_and_says_so(tmp_path: Path) -> None:
    script = tmp_path / "serve_main.py"
    script.write_text(textwrap.dedent("""
        from ors_grpc import Environment, Server, TextBlock, ToolOutput, tool
        from ors_grpc.server import ServerConfig

        class MainEnv(Environment):
            @classmethod
            def list_splits(cls):
                return ["train"]

            @classmethod
            def list_tasks(cls, split):
                return [{}]

            def get_prompt(self):
                return [TextBlock(text="hi")]

            @tool
            def noop(self) -> ToolOutput:
                '''Nothing.'''
                return ToolOutput(blocks=[])

        if __name__ == "__main__":
            Server([MainEnv], config=ServerConfig(workers=2)).run(host="127.0.0.1", port=0, grpc_port=0)
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert "environment 'MainEnv' is defined in __main__" in done.stderr
    assert "serve MODULE:CLASS" in done.stderr


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(line) for line in out.split()]


def _wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
            return  # a zombie: ended, not yet reaped by init
        time.sleep(0.05)
    raise AssertionError(f"worker {pid} outlived its server")
