"""`ors-grpc serve --isolation episode`: every episode in a process of its own,
taken from a pool of started ones, and ended with the episode."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from tests.support.reliability_environments import MARKER_DIR_VARIABLE
from tests.support.reliability_helpers import eventually, grpc_call, grpc_episode, grpc_stub, open_sessions
from tests.support.servers import start_serve

pytestmark = pytest.mark.timeout(120)

WORKER_PROBE = "tests.support.worker_environments:WorkerProbeEnv"


async def grpc_pid(stub, sid: str) -> int:
    events = await grpc_call(stub, sid, "pid")
    return json.loads(events[-1].result.output.metadata.json)["pid"]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")


async def test_each_episode_has_a_process_of_its_own_that_ends_with_it(tmp_path: Path) -> None:
    with start_serve(WORKER_PROBE, "--isolation", "episode", "--workers", "2",
                     env={MARKER_DIR_VARIABLE: str(tmp_path)}) as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            sids = [await grpc_episode(stub, f"episode-{n}", env_name="workerprobeenv") for n in range(3)]
            pids = [await grpc_pid(stub, sid) for sid in sids]
            assert len(set(pids)) == 3 and serve.proc.pid not in pids  # the third came from a refilled pool
            for sid in sids:
                await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
            for pid in pids:
                await eventually(lambda pid=pid: _async(gone(pid)), f"episode process {pid} to end")
            assert sorted(path.name for path in tmp_path.iterdir()) == [f"teardown-episode-{n}" for n in range(3)]
            # Class-level calls and new episodes are still served.
            tasks = await stub.ListTasks(pb.ListTasksRequest(env_name="workerprobeenv", split="train"))
            assert len(tasks.tasks) == 3
            again = await grpc_episode(stub, "again", env_name="workerprobeenv")
            assert await grpc_pid(stub, again) not in pids


async def test_a_crash_costs_exactly_its_own_episode() -> None:
    with start_serve(WORKER_PROBE, "--isolation", "episode", "--workers", "2") as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            doomed = await grpc_episode(stub, "doomed", env_name="workerprobeenv")
            neighbour = await grpc_episode(stub, "neighbour", env_name="workerprobeenv")
            events = await grpc_call(stub, doomed, "exit_process")
            assert "exited with status 3" in events[-1].failure.message
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetPrompt(pb.GetPromptRequest(session_id=doomed))
            assert caught.value.code() == grpc.StatusCode.ABORTED and "exited with status 3" in caught.value.details()
            assert (await grpc_call(stub, neighbour, "echo_tag"))[-1].result.output.blocks[0].text.text == "neighbour"
            for sid in (doomed, neighbour):
                await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
            assert await open_sessions(stub) == 0


async def test_class_level_calls_wait_for_the_pool_rather_than_borrow_an_ending_episodes_process() -> None:
    with start_serve(WORKER_PROBE, "--isolation", "episode", "--workers", "1") as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            for round_ in range(3):  # each takes the one started process, and ends it with its episode
                sid = await grpc_episode(stub, f"episode-{round_}", env_name="workerprobeenv")
                await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
                tasks = await stub.ListTasks(pb.ListTasksRequest(env_name="workerprobeenv", split="train"))
                assert len(tasks.tasks) == 3


async def _async(value: bool) -> bool:
    return value
