"""Faults end to end through both doors of `ors-grpc serve`: dropped streams,
abandoned sessions, hanging tools, failing setup, SIGTERM.

The backend going away under a running bridge (503 + Retry-After, then
recovery) is tests/bridge/test_outage.py.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp
import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from tests.support.reliability_helpers import (
    eventually,
    grpc_call,
    grpc_call_request,
    grpc_episode,
    grpc_stats,
    grpc_stub,
    http_call,
    http_episode,
    http_start_call_and_drop,
    http_stats,
    open_sessions,
    serve_probe,
)

pytestmark = pytest.mark.timeout(120)


async def test_a_call_dropped_mid_tool_is_reattached_by_task_id_and_runs_once_http() -> None:
    with serve_probe() as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http:
            sid = await http_episode(http, "drop")
            task_id = await http_start_call_and_drop(http, sid, "slow", {"seconds": 1.0})
            again = await http_call(http, sid, "slow", {"seconds": 1.0}, task_id=task_id)
            assert again.data("task_id") == task_id
            assert again.result()["output"]["blocks"][0]["text"] == "slow run 1"
            assert (await http_stats(http, sid))["runs"] == {"slow": 1}


async def test_a_call_dropped_mid_tool_is_reattached_by_task_id_and_runs_once_grpc() -> None:
    with serve_probe() as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            sid = await grpc_episode(stub, "drop")
            stream = stub.CallTool(grpc_call_request(sid, "slow", {"seconds": 1.0}))
            task_id = (await stream.read()).task_id
            stream.cancel()  # the client goes away while the tool runs
            events = await grpc_call(stub, sid, "slow", {"seconds": 1.0}, task_id=task_id)
            assert events[0].task_id == task_id
            assert events[1].result.output.blocks[0].text.text == "slow run 1"
            assert (await grpc_stats(stub, sid))["runs"] == {"slow": 1}


async def test_abandoned_sessions_are_reaped_with_teardown(tmp_path: Path) -> None:
    # The reaper sweeps every 5 s; a 0.5 s timeout reaps within about 6 s.
    with serve_probe("--session-timeout", "0.5", marker_dir=tmp_path) as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http, grpc_stub(serve.grpc_target) as stub:
            http_sid = await http_episode(http, "http-abandoned")
            grpc_sid = await grpc_episode(stub, "grpc-abandoned")
            await http_call(http, http_sid, "echo_tag")
            await grpc_call(stub, grpc_sid, "echo_tag")
            # Neither client pings nor deletes from here on.

            async def reaped() -> bool:
                return await open_sessions(stub) == 0

            await eventually(reaped, "the idle sessions to be reaped")
            markers = sorted(path.name for path in tmp_path.iterdir())
            assert markers == ["teardown-grpc-abandoned", "teardown-http-abandoned"]
            async with http.post("/ping", headers={"X-Session-ID": http_sid}) as response:
                assert (response.status, await response.json()) == (
                    404, {"detail": f"Active environment not found: no open episode has session id {http_sid!r}"})
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Ping(pb.PingRequest(session_id=grpc_sid))
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_tool_hanging_past_the_tool_timeout_is_a_failure_and_the_session_lives_on() -> None:
    with serve_probe("--tool-timeout", "1") as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http, grpc_stub(serve.grpc_target) as stub:
            http_sid = await http_episode(http, "hang")
            stream = await http_call(http, http_sid, "hang")
            assert stream.names() == ["task_id", "error"]
            assert stream.data("error") == "tool call timed out after 1s"
            # Tools within the limit still run, in the same session.
            assert (await http_call(http, http_sid, "slow", {"seconds": 0.1})).result()["ok"] is True

            grpc_sid = await grpc_episode(stub, "hang")
            events = await grpc_call(stub, grpc_sid, "hang")
            assert events[1].failure.message == "tool call timed out after 1s"
            assert (await grpc_stats(stub, grpc_sid))["runs"] == {"hang": 1}


async def test_a_setup_that_raises_fails_every_waiting_call_through_both_doors() -> None:
    with serve_probe() as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http, grpc_stub(serve.grpc_target) as stub:
            # Setup sleeps 0.5 s, then raises: every call below is already waiting.
            sid = await http_episode(http, "doomed", env_name="latefailingsetupenv")
            headers = {"X-Session-ID": sid}

            async def http_status(method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
                async with http.request(method, path, json=body, headers=headers) as response:
                    return response.status, await response.json()

            async def grpc_error(call) -> tuple[grpc.StatusCode, str]:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    if hasattr(call, "__aiter__"):
                        [event async for event in call]
                    else:
                        await call
                return caught.value.code(), caught.value.details()

            http_waiters = [
                http_status("GET", "/probeenv/prompt"),
                http_status("GET", "/probeenv/task_tools"),
                *(http_status("POST", "/probeenv/call", {"name": "echo_tag", "input": {}}) for _ in range(3)),
            ]
            grpc_waiters = [
                grpc_error(stub.GetPrompt(pb.GetPromptRequest(session_id=sid))),
                grpc_error(stub.ListTaskTools(pb.ListTaskToolsRequest(session_id=sid))),
                *(grpc_error(stub.CallTool(grpc_call_request(sid, "echo_tag"))) for _ in range(3)),
            ]
            http_results, grpc_results = await asyncio.gather(
                asyncio.gather(*http_waiters), asyncio.gather(*grpc_waiters)
            )
            assert http_results == [(500, {"detail": "RuntimeError: setup exploded late"})] * 5
            assert grpc_results == [(grpc.StatusCode.FAILED_PRECONDITION, "RuntimeError: setup exploded late")] * 5
            # The session itself stays until deleted, and deleting it works.
            async with http.post("/delete", headers=headers) as response:
                assert response.status == 200
            assert await open_sessions(stub) == 0


async def test_sigterm_past_the_drain_timeout_tears_down_every_session_of_both_doors_even_with_calls_running(
    tmp_path: Path,
) -> None:
    with serve_probe("--drain-timeout", "0", marker_dir=tmp_path) as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http, grpc_stub(serve.grpc_target) as stub:
            for number in range(3):
                await http_call(http, await http_episode(http, f"http-{number}"), "echo_tag")
                await grpc_call(stub, await grpc_episode(stub, f"grpc-{number}"), "echo_tag")
            # Two more sessions with a tool call still running at shutdown.
            busy_http = await http_episode(http, "http-busy")
            busy_grpc = await grpc_episode(stub, "grpc-busy")
            running = [
                asyncio.ensure_future(http_call(http, busy_http, "hang")),
                asyncio.ensure_future(grpc_call(stub, busy_grpc, "hang")),
            ]

            async def both_running() -> bool:
                runs = [(await grpc_stats(stub, sid))["runs"] for sid in (busy_http, busy_grpc)]
                return runs == [{"hang": 1}] * 2

            await eventually(both_running, "both hanging calls to start")
            assert await asyncio.get_running_loop().run_in_executor(None, serve.stop, signal.SIGTERM) == 0
            await asyncio.wait(running, timeout=5)  # their streams end with the server
            for task in running:
                task.cancel()
    tags = [f"{door}-{suffix}" for door in ("http", "grpc") for suffix in ("0", "1", "2", "busy")]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(f"teardown-{tag}" for tag in tags)
    assert json.loads((tmp_path / "teardown-http-busy").read_text())["runs"] == {"hang": 1}
