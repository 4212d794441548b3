"""Graceful drain of `ors-grpc serve` (SIGTERM, `ors-grpc drain`, the Drain RPC).

A draining server answers NOT_SERVING to grpc.health.v1 on every service
name, refuses new episodes on every path (CreateEpisode, a RunEpisode
`create` step, PrepareEpisodes, HTTP `/create` and `/prepare`) with
UNAVAILABLE / ERROR_REASON_DRAINING (HTTP 503 + Retry-After), keeps serving
the episodes it holds through both doors, and exits (status 0) once the
last one ends, or at its drain timeout, or at a second signal.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc._generated.ors.v1 import errors_pb2, types_pb2
from ors_grpc.client import AsyncORSClient, ORSServerError, session
from ors_grpc.server import ServerConfig, create_server, in_process_channel
from tests.support import bridge_http
from tests.support.environments import EchoEnv
from tests.support.grpc_calls import call_tool, create_episode, error_reason, expect_error
from tests.support.servers import ROOT, ServeProcess, start_serve
from tests.support.warm_environments import MARKER_DIR_VARIABLE, read_events

SERVICE_NAMES = ("", "ors.v1.EnvironmentService")
TEARDOWN_ENV = "tests.support.environments:TeardownRecordingEnv"
EXIT_WAIT_S = 30.0
WAIT_S = 20.0


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def health_statuses(channel: grpc.aio.Channel) -> set[int]:
    health = health_pb2_grpc.HealthStub(channel)
    return {(await health.Check(health_pb2.HealthCheckRequest(service=name))).status for name in SERVICE_NAMES}


async def until_not_serving(channel: grpc.aio.Channel) -> None:
    async def not_serving() -> bool:
        return await health_statuses(channel) == {health_pb2.HealthCheckResponse.NOT_SERVING}

    await eventually(not_serving, "health to turn NOT_SERVING")


async def exit_status(serve: ServeProcess) -> int:
    return await asyncio.get_running_loop().run_in_executor(None, serve.proc.wait, EXIT_WAIT_S)


def new_episode_request(sid: str) -> pb.CreateEpisodeRequest:
    return pb.CreateEpisodeRequest(session_id=sid, env_name="echoenv", task_index=pb.TaskIndex(split="train", index=0))


async def test_sigterm_refuses_new_episodes_on_every_path_serves_the_open_ones_and_exits_after_the_last():
    with start_serve("tests.support.environments:EchoEnv", "--http-port", "0") as serve:
        async with grpc.aio.insecure_channel(serve.grpc_target) as channel, \
                aiohttp.ClientSession(base_url=serve.http_url) as http:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            assert await health_statuses(channel) == {health_pb2.HealthCheckResponse.SERVING}
            grpc_sid = await create_episode(stub)
            http_sid = await bridge_http.create_episode(http, {"split": "train", "index": 1})
            issued_sid = await bridge_http.new_session_id(http)  # its episode is created during the drain

            serve.proc.send_signal(signal.SIGTERM)
            await until_not_serving(channel)

            refused = await expect_error(stub.CreateEpisode(new_episode_request("after-drain")))
            assert refused.code() == grpc.StatusCode.UNAVAILABLE
            assert error_reason(refused) == "ERROR_REASON_DRAINING"
            assert dict(refused.trailing_metadata())["retry-after"] == "1"
            stream = stub.RunEpisode()
            await stream.write(pb.RunEpisodeRequest(create=new_episode_request("on-a-stream")))
            step = (await stream.read()).error
            assert (step.code, step.reason) == (grpc.StatusCode.UNAVAILABLE.value[0], errors_pb2.ERROR_REASON_DRAINING)
            stream.cancel()
            prepare = pb.PrepareEpisodesRequest(env_name="echoenv", split="train", indices=[0])
            assert error_reason(await expect_error(stub.PrepareEpisodes(prepare))) == "ERROR_REASON_DRAINING"
            # No new session id either: the client asks again, which a proxy sends elsewhere.
            refused = await expect_error(stub.CreateSessionId(pb.CreateSessionIdRequest()))
            assert (refused.code(), error_reason(refused)) == (grpc.StatusCode.UNAVAILABLE, "ERROR_REASON_DRAINING")
            async with http.post("/create_session") as response:
                assert (response.status, response.headers["Retry-After"]) == (503, "1")
            for path, body in (("/create", {"split": "train", "index": 0}), ("/echoenv/prepare", {"split": "train", "indices": [0]})):
                async with http.post(path, json=body, headers={"X-Session-ID": "never-issued"}) as response:
                    assert response.status == 503, path
                    assert response.headers["Retry-After"] == "1"
                    assert "draining" in (await response.json())["detail"]
            # But an id this server issued before its drain is created under: behind a proxy
            # that routes an id to the server that issued it, the client's retries could reach no other.
            async with http.post("/create", json={"split": "train", "index": 0},
                                 headers={"X-Session-ID": issued_sid}) as response:
                assert response.status == 200, await response.text()
            async with http.post("/delete", headers={"X-Session-ID": issued_sid}) as response:
                assert response.status == 200

            # The open episodes go on, through both doors.
            _, result = await call_tool(stub, grpc_sid, "echo", {"text": "still here"})
            assert result.result.output.blocks[0].text.text == "still here"
            events = await bridge_http.call(http, http_sid, "echo", {"text": "over http"})
            assert events.result()["output"]["blocks"][0]["text"] == "over http"

            await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=grpc_sid))
            await call_tool(stub, http_sid, "echo", {"text": "one left"})
            assert serve.proc.poll() is None  # one episode is still open
            async with http.post("/delete", headers={"X-Session-ID": http_sid}) as response:
                assert response.status == 200
            assert await exit_status(serve) == 0


async def test_the_drain_timeout_ends_the_episodes_left_and_exits(tmp_path: Path):
    record = tmp_path / "teardowns.txt"
    env = {"ORS_TEST_TEARDOWN_FILE": str(record)}
    with start_serve(TEARDOWN_ENV, "--drain-timeout", "1", env=env) as serve:
        async with grpc.aio.insecure_channel(serve.grpc_target) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            sid = await create_episode(stub, "teardownrecordingenv", index=1)
            await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
            serve.proc.send_signal(signal.SIGTERM)
            assert await exit_status(serve) == 0
    assert record.read_text().splitlines() == ["teardown 1"]


@pytest.mark.parametrize("begun_by", ["SIGTERM", "ors-grpc drain"])
async def test_a_second_signal_cuts_the_drain_short_as_the_terminal_and_the_log_say(tmp_path: Path, begun_by: str):
    record = tmp_path / "teardowns.txt"
    env = {"ORS_TEST_TEARDOWN_FILE": str(record)}
    with open(tmp_path / "stderr.txt", "w") as log, start_serve(TEARDOWN_ENV, env=env, stderr=log) as serve:
        async with grpc.aio.insecure_channel(serve.grpc_target) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            sid = await create_episode(stub, "teardownrecordingenv", index=0)
            await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
            if begun_by == "SIGTERM":
                serve.proc.send_signal(signal.SIGTERM)
            else:
                assert drain_command(serve.grpc_target).wait(EXIT_WAIT_S) == 0
            await until_not_serving(channel)
            await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))  # served while draining
            said = await asyncio.get_running_loop().run_in_executor(None, next_line_saying, serve, "draining: ")
            # The default drain timeout: 300 s.
            assert re.fullmatch(r"draining: 1 episodes open, served for up to (300|299) s while new ones are refused; "
                                r"to stop at once, press Ctrl-C \(SIGINT\) or send a second SIGTERM", said), said
            # After a SIGTERM, another one; after `ors-grpc drain`, Ctrl-C (its first SIGTERM only drains).
            serve.proc.send_signal(signal.SIGTERM if begun_by == "SIGTERM" else signal.SIGINT)
            assert await exit_status(serve) == 0
    assert record.read_text().splitlines() == ["teardown 0"]
    [started] = [line for line in (tmp_path / "stderr.txt").read_text().splitlines() if "drain_started" in line]
    assert started.endswith('drain_started open_sessions=1 timeout_s=300 '
                            'stop_at_once="press Ctrl-C (SIGINT) or send a second SIGTERM"'), started


def next_line_saying(serve: ServeProcess, prefix: str) -> str:
    while True:
        line = serve.lines.get(timeout=WAIT_S)
        assert line is not None, "the server exited"
        if line.startswith(prefix):
            return line


def drain_command(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ors_grpc.cli", "drain", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def test_ors_grpc_drain_waits_for_the_server_and_ends_the_prepared_episodes_at_once(tmp_path: Path):
    env = {MARKER_DIR_VARIABLE: str(tmp_path)}
    with start_serve("tests.support.warm_environments:WarmEnv", "--api-key", "k", env=env) as serve:
        async with grpc.aio.insecure_channel(serve.grpc_target) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            key = (("x-api-key", "k"),)
            prepare = pb.PrepareEpisodesRequest(task_specs=[types_pb2.JsonValue(json='{"tag": "warm"}')])
            await stub.PrepareEpisodes(prepare, metadata=key)
            sid = (await stub.CreateSessionId(pb.CreateSessionIdRequest(), metadata=key)).session_id
            create = pb.CreateEpisodeRequest(session_id=sid, task_spec=types_pb2.JsonValue(json='{"tag": "open"}'))
            await stub.CreateEpisode(create, metadata=key)
            await stub.GetPrompt(pb.GetPromptRequest(session_id=sid), metadata=key)

            without_key = drain_command(serve.grpc_target)
            assert without_key.wait(EXIT_WAIT_S) == 1
            assert "UNAUTHENTICATED" in without_key.stderr.read()
            waiting = drain_command(serve.grpc_target, "--api-key", "k", "--wait")
            first = await asyncio.get_running_loop().run_in_executor(None, waiting.stdout.readline)
            assert first.startswith(f"{serve.grpc_target} is draining: 1 episodes open")
            await until_not_serving(channel)

            async def prepared_one_torn_down() -> bool:
                return ("teardown", "warm") in {(kind, tag) for kind, tag, _ in read_events(tmp_path)}

            await eventually(prepared_one_torn_down, "the prepared episode's teardown")
            assert waiting.poll() is None and serve.proc.poll() is None  # the open episode holds both
            await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid), metadata=key)
            rest = await asyncio.get_running_loop().run_in_executor(None, waiting.communicate, None, EXIT_WAIT_S)
            assert waiting.returncode == 0
            assert rest[0].splitlines()[-1] == f"{serve.grpc_target} has stopped"
            assert await exit_status(serve) == 0
    tags = sorted(tag for kind, tag, _ in read_events(tmp_path) if kind == "teardown")
    assert tags == ["open", "warm"]


async def test_the_drain_rpc_is_refused_to_a_peer_off_this_host():
    # The in-process channel's peer is no loopback address: it stands for a remote caller.
    server, port = await create_server([EchoEnv], "127.0.0.1:0", config=ServerConfig())
    try:
        stub = pb_grpc.EnvironmentServiceStub(in_process_channel(server))
        refused = await expect_error(stub.Drain(pb.DrainRequest()))
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error_reason(refused) == "ERROR_REASON_PEER_NOT_LOCAL"
        assert not server.drain.begun.is_set()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            answer = await pb_grpc.EnvironmentServiceStub(channel).Drain(pb.DrainRequest())
            assert answer.open_sessions == 0 and 0 < answer.seconds_left <= 300
            assert await health_statuses(channel) == {health_pb2.HealthCheckResponse.NOT_SERVING}
    finally:
        await server.stop(None)


async def test_a_creation_a_draining_server_refused_is_made_again_until_the_clients_patience_ends(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
):
    # Patience, not a count of tries: behind a proxy each try is a new draw of
    # the backends. 7 s hold the waits of 50 ms doubling to 1 s nine times over
    # (4.55 s) with room: more than the 8 tries again a count allowed.
    monkeypatch.setattr(session, "DRAINING_PATIENCE_S", 7.0)
    caplog.set_level(logging.INFO, logger="ors_grpc.client")
    server, port = await create_server([EchoEnv], "127.0.0.1:0", config=ServerConfig())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            await create_episode(stub)  # holds the drain open
            await stub.Drain(pb.DrainRequest())
        async with AsyncORSClient(f"127.0.0.1:{port}") as client:
            with pytest.raises(ORSServerError) as refused:
                async with client.environment("echoenv").session(split="train", index=0):
                    pass
        assert refused.value.reason == "ERROR_REASON_DRAINING"
        tries_again = [record for record in caplog.records if "draining" in record.getMessage()]
        assert len(tries_again) >= 9
    finally:
        await server.stop(None)


async def test_a_drain_ends_only_once_calls_stop_coming_and_still_creates_under_the_ids_it_issued():
    # A call that reaches a gRPC server as it stops is answered CANCELLED, which no client retries:
    # the drain outlasts the calls still arriving (a proxy that has not yet seen NOT_SERVING), and
    # the creation under an id this server issued before its drain, which only it can make.
    server, port = await create_server([EchoEnv], "127.0.0.1:0", config=ServerConfig())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            issued = (await stub.CreateSessionId(pb.CreateSessionIdRequest())).session_id
            await server.drain.begin()  # no episode open
            done = asyncio.create_task(server.drain.until_done())
            for _ in range(8):  # 1.6 s of creations refused, each well within the quiet period of the last
                refused = await expect_error(stub.CreateSessionId(pb.CreateSessionIdRequest()))
                assert error_reason(refused) == "ERROR_REASON_DRAINING"
                await asyncio.sleep(0.2)
            assert not done.done()
            await stub.CreateEpisode(new_episode_request(issued))
            _, result = await call_tool(stub, issued, "echo", {"text": "made while draining"})
            assert result.result.output.blocks[0].text.text == "made while draining"
            await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=issued))
            assert await asyncio.wait_for(done, WAIT_S) is True  # quiet now: it ends
    finally:
        await server.stop(None)
