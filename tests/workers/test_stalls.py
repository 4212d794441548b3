"""`ors-grpc serve --worker-stall-limit`: a worker whose event loop lags
(measured in the worker, off its loop) or that stops reporting past the
limit is killed and replaced, with no tool timeout set; its episodes answer
ERROR_REASON_ENVIRONMENT_CRASHED with cause `stalled`, every other episode
goes on; load alone never trips it. Outcomes are asserted, never timings."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import aiohttp
import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.protocol.constants import ERROR_REASON_METADATA_KEY, STATUS_DETAILS_METADATA_KEY
from tests.support.bridge_http import read_sse
from tests.support.reliability_helpers import eventually, grpc_call, grpc_episode, grpc_stub, http_episode
from tests.support.processes import children
from tests.support.servers import ServeProcess, start_serve

pytestmark = pytest.mark.timeout(120)

STALL_PROBE = "tests.support.stall_environments:StallProbeEnv"
ENV_NAME = "stallprobeenv"
#: The stall limit of these tests, in seconds (the default is 60).
STALL_LIMIT = "2"
#: How the call in flight, and every later call, of an episode whose worker stalled reads.
STALLED = "the environment's worker process was killed because its event loop stalled (SIGKILL)"
#: A blocking call that only the kill ends.
FOREVER = {"seconds": 3600}
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
#: How long the load test keeps every episode busy: several stall limits.
LOAD_S = 4 * float(STALL_LIMIT)


@contextlib.contextmanager
def serve_stalls(log: Path, *options: str, stall_limit: str = STALL_LIMIT) -> Iterator[ServeProcess]:
    """`ors-grpc serve` of StallProbeEnv with both doors and no tool timeout; its log (workers' too) in `log`."""
    with log.open("w") as stderr, start_serve(STALL_PROBE, "--http-port", "0", "--worker-stall-limit", stall_limit,
                                              *options, stderr=stderr) as serve:
        yield serve


def log_lines(log: Path, text: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if text in line]


class GrpcDoor:
    """An episode's calls over gRPC."""

    def __init__(self, stub: pb_grpc.EnvironmentServiceStub) -> None:
        self.stub = stub

    async def episode(self, tag: str) -> str:
        return await grpc_episode(self.stub, tag, env_name=ENV_NAME)

    async def output(self, sid: str, tool: str, tool_input: dict | None = None) -> tuple[str, dict]:
        """A call that succeeds: its first text block (or "") and metadata."""
        result = (await grpc_call(self.stub, sid, tool, tool_input))[-1]
        assert result.HasField("result"), result
        blocks = result.result.output.blocks
        return (blocks[0].text.text if blocks else ""), json.loads(result.result.output.metadata.json or "{}")

    async def crashed_call(self, sid: str, tool: str, tool_input: dict | None = None) -> tuple[str, dict[str, str]]:
        """A call whose process is killed under it, answered as crashed: its message and ErrorInfo metadata."""
        return self._crash(await _rpc_error(grpc_call(self.stub, sid, tool, tool_input)))

    async def refusal(self, sid: str) -> tuple[str, dict[str, str]]:
        """The episode's next call, refused as crashed: its message and ErrorInfo metadata."""
        return self._crash(await _rpc_error(self.stub.GetPrompt(pb.GetPromptRequest(session_id=sid))))

    @staticmethod
    def _crash(error: grpc.aio.AioRpcError) -> tuple[str, dict[str, str]]:
        trailers = dict(error.trailing_metadata() or ())
        assert (error.code(), trailers[ERROR_REASON_METADATA_KEY]) == (
            grpc.StatusCode.ABORTED, "ERROR_REASON_ENVIRONMENT_CRASHED")
        info = error_details_pb2.ErrorInfo()
        assert status_pb2.Status.FromString(trailers[STATUS_DETAILS_METADATA_KEY]).details[0].Unpack(info)
        return error.details(), dict(info.metadata)

    async def delete(self, sid: str) -> None:
        await self.stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))


class HttpDoor:
    """An episode's calls over the HTTP door (`serve --http-port`)."""

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http

    async def episode(self, tag: str) -> str:
        return await http_episode(self.http, tag, env_name=ENV_NAME)

    async def crashed_call(self, sid: str, tool: str, tool_input: dict | None = None) -> tuple[str, dict[str, str]]:
        """A call whose process is killed under it: 410 before the first byte, else an `error` event
        with the reason; its message (HTTP carries no metadata)."""
        body = {"name": tool, "input": tool_input or {}}
        async with self.http.post(f"/{ENV_NAME}/call", json=body, headers={"X-Session-ID": sid}) as response:
            if response.status != 200:
                assert response.status == 410, await response.text()
                return (await response.json())["detail"], {}
            stream = await read_sse(response)
        assert stream.names() == ["task_id", "error"] and stream.reasons["error"] == "ERROR_REASON_ENVIRONMENT_CRASHED"
        return stream.data("error"), {}

    async def _call(self, sid: str, tool: str, tool_input: dict | None):
        body = {"name": tool, "input": tool_input or {}}
        async with self.http.post(f"/{ENV_NAME}/call", json=body, headers={"X-Session-ID": sid}) as response:
            assert response.status == 200, await response.text()
            return await read_sse(response)

    async def output(self, sid: str, tool: str, tool_input: dict | None = None) -> tuple[str, dict]:
        output = (await self._call(sid, tool, tool_input)).result()["output"]
        blocks = output["blocks"]
        return (blocks[0]["text"] if blocks else ""), output.get("metadata") or {}

    async def refusal(self, sid: str) -> tuple[str, dict[str, str]]:
        """The episode's next call, refused as crashed (410): its detail (HTTP carries no metadata)."""
        async with self.http.get(f"/{ENV_NAME}/prompt", headers={"X-Session-ID": sid}) as response:
            assert response.status == 410, await response.text()
            return (await response.json())["detail"], {}

    async def delete(self, sid: str) -> None:
        async with self.http.post("/delete", headers={"X-Session-ID": sid}) as response:
            assert response.status == 200, await response.text()


@contextlib.asynccontextmanager
async def doors(serve: ServeProcess) -> AsyncIterator[dict[str, GrpcDoor | HttpDoor]]:
    async with grpc_stub(serve.grpc_target) as stub, aiohttp.ClientSession(base_url=serve.http_url) as http:
        yield {"grpc": GrpcDoor(stub), "http": HttpDoor(http)}


async def pid_of(door: GrpcDoor | HttpDoor, sid: str) -> int:
    return (await door.output(sid, "pid"))[1]["pid"]


async def runs_of(door: GrpcDoor | HttpDoor, sid: str) -> dict[str, int]:
    return (await door.output(sid, "stats"))[1]["runs"]


async def _rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def assert_stalled(refusal: tuple[str, dict[str, str]]) -> None:
    message, metadata = refusal
    assert STALLED in message
    if metadata:  # gRPC: the facts in ErrorInfo
        assert metadata == {"cause": "stalled", "signal": "SIGKILL"}


async def a_new_worker_serves(door: GrpcDoor | HttpDoor, old_pids: set[int]) -> None:
    """Wait until a new episode lands in a worker started in the place of the dead one."""

    async def new_pid() -> bool:
        fresh = await door.episode("fresh")
        pid = await pid_of(door, fresh)
        await door.delete(fresh)
        return pid not in old_pids

    await eventually(new_pid, "a new worker in the stalled one's place")


@pytest.mark.parametrize("door_name", ["grpc", "http"])
@pytest.mark.parametrize("tool, tool_input", [("block_loop", FOREVER), ("spin_loop", {})],
                         ids=["time.sleep in an async def", "while True in an async def"])
async def test_a_worker_whose_event_loop_stalls_is_killed_and_replaced_and_no_other_episode_loses_anything(
        tmp_path: Path, door_name: str, tool: str, tool_input: dict) -> None:
    log = tmp_path / "serve.log"
    with serve_stalls(log, "--workers", "2") as serve:
        async with doors(serve) as by_name:
            door = by_name[door_name]
            doomed, healthy = await door.episode("doomed"), await door.episode("healthy")
            doomed_pid, healthy_pid = await pid_of(door, doomed), await pid_of(door, healthy)
            assert doomed_pid != healthy_pid  # one episode per worker
            assert (await door.output(healthy, "echo_tag"))[0] == "healthy"

            # No tool timeout: the stall limit ends the call (as crashed, naming the stall); so does every later call.
            assert_stalled(await door.crashed_call(doomed, tool, tool_input))
            assert_stalled(await door.refusal(doomed))

            # The episode in the other worker lost nothing: same process, same state.
            assert await pid_of(door, healthy) == healthy_pid
            assert (await door.output(healthy, "echo_tag"))[0] == "healthy"
            assert await runs_of(door, healthy) == {"echo_tag": 2}
            await a_new_worker_serves(door, {doomed_pid, healthy_pid})

    [killed] = log_lines(log, "worker_killed")
    assert "level=ERROR" in killed and "reason=event_loop_held" in killed and "episodes=1" in killed
    assert f"pid={doomed_pid} " in killed
    # The worker's own log named the code holding its loop before it was killed.
    assert any(f"environment=StallProbeEnv function={tool} " in line for line in log_lines(log, "event_loop_stalled"))


async def test_a_frozen_worker_that_stops_reporting_is_killed_as_stalled(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serve_stalls(log, "--workers", "2") as serve:
        async with doors(serve) as door:
            doomed = await door["http"].episode("doomed")
            healthy = await door["grpc"].episode("healthy")
            doomed_pid, healthy_pid = await pid_of(door["http"], doomed), await pid_of(door["grpc"], healthy)
            assert doomed_pid != healthy_pid
            os.kill(doomed_pid, signal.SIGSTOP)  # no heartbeat, no event loop, no thread runs

            # The episode's calls wait for the stopped worker until it is killed, then say why, on both doors.
            assert_stalled(await door["http"].refusal(doomed))
            assert_stalled(await door["grpc"].refusal(doomed))
            assert await pid_of(door["grpc"], healthy) == healthy_pid
            assert (await door["grpc"].output(healthy, "echo_tag"))[0] == "healthy"
            await a_new_worker_serves(door["grpc"], {doomed_pid, healthy_pid})

    [killed] = log_lines(log, "worker_killed")
    assert "level=ERROR" in killed and "reason=no_heartbeat" in killed and f"pid={doomed_pid} " in killed


async def test_c_code_holding_the_gil_is_a_stall_too(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serve_stalls(log, "--workers", "1") as serve:
        async with doors(serve) as door:
            doomed = await door["grpc"].episode("doomed")
            # A sync tool (in a user-code thread) whose regex never lets the GIL go: the whole process stops.
            assert_stalled(await door["grpc"].crashed_call(doomed, "hold_the_gil"))
            assert_stalled(await door["grpc"].refusal(doomed))

    [killed] = log_lines(log, "worker_killed")
    assert "reason=no_heartbeat" in killed


async def test_with_episode_isolation_a_stall_costs_exactly_its_own_episode(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serve_stalls(log, "--isolation", "episode", "--workers", "2") as serve:
        async with doors(serve) as door:
            doomed = await door["http"].episode("doomed")
            neighbour = await door["grpc"].episode("neighbour")
            neighbour_pid = await pid_of(door["grpc"], neighbour)
            assert await pid_of(door["http"], doomed) != neighbour_pid

            assert_stalled(await door["http"].crashed_call(doomed, "spin_loop"))
            assert_stalled(await door["http"].refusal(doomed))
            assert_stalled(await door["grpc"].refusal(doomed))

            assert await pid_of(door["grpc"], neighbour) == neighbour_pid
            assert (await door["grpc"].output(neighbour, "echo_tag"))[0] == "neighbour"
            assert await runs_of(door["grpc"], neighbour) == {"echo_tag": 1}

    [killed] = log_lines(log, "worker_killed")
    assert "reason=event_loop_held" in killed and "episodes=1" in killed


async def test_a_stall_limit_of_zero_lets_a_blocked_loop_run_on(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serve_stalls(log, "--workers", "1", stall_limit="0") as serve:
        async with doors(serve) as door:
            sid = await door["grpc"].episode("patient")
            pid = await pid_of(door["grpc"], sid)
            # Longer than the tests' limit: answered, by the same process.
            assert (await door["grpc"].output(sid, "block_loop", {"seconds": 2 * float(STALL_LIMIT)}))[0] == "slept"
            assert await pid_of(door["grpc"], sid) == pid
    assert log_lines(log, "worker_killed") == []


async def test_load_alone_never_trips_the_stall_limit(tmp_path: Path) -> None:
    """Many episodes on both doors keep the workers' CPUs and threads busy (a CPU-heavy sync tool
    in threads, quick `async def` calls) for several stall limits: no worker is killed."""
    log = tmp_path / "serve.log"
    with serve_stalls(log, "--workers", "2") as serve:
        workers = children(serve.proc.pid)
        assert len(workers) == 2
        async with doors(serve) as door:
            episodes = [(name, await door[name].episode(f"{name}-{n}")) for name in ("grpc", "http") for n in range(12)]
            pids = {sid: await pid_of(door[name], sid) for name, sid in episodes}
            assert set(pids.values()) == set(workers)
            for name, sid in episodes:
                await door[name].output(sid, "echo_tag")
            deadline = asyncio.get_running_loop().time() + LOAD_S

            async def busy(name: str, sid: str) -> int:
                calls = 0
                while asyncio.get_running_loop().time() < deadline:
                    await door[name].output(sid, "crunch")
                    assert (await door[name].output(sid, "tick"))[0] == "tick"
                    calls += 2
                return calls

            calls = await asyncio.gather(*(busy(name, sid) for name, sid in episodes))
            assert all(calls)
            for name, sid in episodes:  # every episode in its process, its state intact
                assert await pid_of(door[name], sid) == pids[sid]
                assert await runs_of(door[name], sid) == {"echo_tag": 1}
        assert children(serve.proc.pid) == workers
    assert log_lines(log, "worker_killed") == [] and log_lines(log, "level=ERROR") == []


async def test_new_episodes_go_around_a_worker_whose_loop_is_held(tmp_path: Path) -> None:
    """Long before the stall limit (the default here), a worker whose loop one call holds takes no
    new episode: with it the only worker, health says NOT_SERVING and creations are refused, to be
    retried, rather than sent to wait behind the stall; once its loop runs again, it takes them."""
    log = tmp_path / "serve.log"
    with serve_stalls(log, "--workers", "1", stall_limit="60") as serve:
        async with doors(serve) as door, grpc.aio.insecure_channel(serve.grpc_target) as channel:
            stub, health = pb_grpc.EnvironmentServiceStub(channel), health_pb2_grpc.HealthStub(channel)
            busy = await door["grpc"].episode("busy")
            worker_pid = await pid_of(door["grpc"], busy)
            held = asyncio.ensure_future(door["grpc"].output(busy, "block_loop", {"seconds": 12}))
            await eventually(lambda: _health_is(health, NOT_SERVING), "health to say the one worker is stalled")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await grpc_episode(stub, "refused", env_name=ENV_NAME)
            trailers = dict(refused.value.trailing_metadata() or ())
            assert trailers[ERROR_REASON_METADATA_KEY] == "ERROR_REASON_ENVIRONMENT_STARTING"
            assert "stalled" in refused.value.details()
            assert (await held)[0] == "slept"  # its own call went on: nothing was killed
            await eventually(lambda: _health_is(health, SERVING), "health to say the worker serves again")
            fresh = await door["grpc"].episode("fresh")
            assert await pid_of(door["grpc"], fresh) == worker_pid
    assert log_lines(log, "worker_killed") == []


async def _health_is(health: health_pb2_grpc.HealthStub, status: int) -> bool:
    return (await health.Check(health_pb2.HealthCheckRequest())).status == status
