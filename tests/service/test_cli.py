"""`ors-grpc serve` as a subprocess: a real episode, the bundled example, a graceful stop."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from tests.support.grpc_calls import call_tool, create_episode, tool_call
from ors_grpc._runtime.loop_monitor import STALL_WARNING_S
from tests.support.servers import ROOT, STOP_TIMEOUT_S, start_serve


async def test_sigterm_with_no_drain_timeout_tears_down_every_session_and_exits_zero(tmp_path: Path) -> None:
    record = tmp_path / "teardowns.txt"
    env = {"ORS_TEST_TEARDOWN_FILE": str(record)}
    with start_serve("tests.support.environments:TeardownRecordingEnv", "--drain-timeout", "0", env=env) as serve:
        async with grpc.aio.insecure_channel(serve.grpc_target) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            for index in (0, 1):
                sid = await create_episode(stub, "teardownrecordingenv", index=index)
                await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
        assert serve.stop(signal.SIGTERM) == 0
    assert sorted(record.read_text().splitlines()) == ["teardown 0", "teardown 1"]


async def test_a_stop_signal_stops_the_server_despite_a_stuck_sync_tool() -> None:
    with start_serve("tests.support.environments:BlockingToolEnv") as serve:
        async with grpc.aio.insecure_channel(serve.grpc_target) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            sid = await create_episode(stub, "blockingtoolenv")
            call = stub.CallTool(pb.CallToolRequest(session_id=sid, call=tool_call("block", {"seconds": 600})))
            await call.read()  # the tool is dispatched; it blocks its thread
            call.cancel()
        assert serve.stop() == 0  # not killed: the stuck thread did not hold the exit


async def test_a_second_stop_signal_exits_at_once_while_environments_code_holds_the_event_loop(
        tmp_path: Path) -> None:
    # In-process an `async def` tool that spins holds the loop, which would take the signals: the
    # first one waits for it; one that comes after it has waited long enough exits the process.
    log = tmp_path / "serve.log"
    with log.open("w") as stderr, start_serve("tests.support.stall_environments:StallProbeEnv", "--in-process",
                                              stderr=stderr) as serve:
        async with grpc.aio.insecure_channel(serve.grpc_target) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            sid = await create_episode(stub, "stallprobeenv")
            spinning = asyncio.ensure_future(stub.CallTool(
                pb.CallToolRequest(session_id=sid, call=tool_call("spin_loop", {}))).read())
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while "event_loop_stalled" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()
                await asyncio.sleep(0.1)
            serve.proc.send_signal(signal.SIGINT)
            await asyncio.sleep(STALL_WARNING_S + 0.5)  # the loop takes nothing meanwhile
            assert serve.proc.poll() is None, log.read_text()
            serve.proc.send_signal(signal.SIGINT)
            status = await asyncio.to_thread(serve.proc.wait, STOP_TIMEOUT_S)
            spinning.cancel()
    assert status == 128 + signal.SIGINT
    assert "stop_forced signal=SIGINT" in log.read_text()


async def test_serve_without_environment_runs_the_bundled_example() -> None:
    with start_serve() as serve:
        async with grpc.aio.insecure_channel(serve.grpc_target) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            assert list((await stub.ListEnvironments(pb.ListEnvironmentsRequest())).names) == ["arithmetic"]
            sid = await create_episode(stub, "arithmetic", split="train", index=1)
            prompt = await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
            assert "7 * 6" in prompt.blocks[0].text.text
            _, event = await call_tool(stub, sid, "calculator", {"a": 7, "b": 6, "op": "*"})
            assert event.result.output.blocks[0].text.text == "42"
            _, event = await call_tool(stub, sid, "submit", {"answer": 42})
            output = event.result.output
            assert (output.reward, output.finished) == (1.0, True)
        assert serve.stop() == 0


def test_bad_environment_spec_fails_with_a_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ors_grpc", "serve", "--port", "0", "no_such_module_here:Env"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert "no_such_module_here" in result.stderr


def test_help_lists_both_subcommands() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ors_grpc", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "serve" in result.stdout and "bridge" in result.stdout
