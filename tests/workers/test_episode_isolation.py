"""`ors-grpc serve --isolation episode`: every episode in a process of its own,
forked from a template process that imported the environments, taken from a
pool of started ones, and ended with the episode."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import signal
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from tests.support.reliability_environments import MARKER_DIR_VARIABLE
from tests.support.reliability_helpers import eventually, grpc_call, grpc_episode, grpc_pid, grpc_stub, open_sessions
from tests.support.processes import descendants, parent_of, process_gone
from tests.support.servers import start_serve
from tests.support.worker_environments import POISON_VARIABLE

pytestmark = pytest.mark.timeout(120)

WORKER_PROBE = "tests.support.worker_environments:WorkerProbeEnv"
#: The traceback's last line of a process that could not import the poisoned environments.
POISONED = "RuntimeError: poisoned: this worker cannot start"


async def refuses_prompts(stub, sid: str) -> bool:
    """Whether the episode's GetPrompt is refused now (its process is gone)."""
    try:
        await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
    except grpc.aio.AioRpcError:
        return True
    return False


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
                await eventually(lambda pid=pid: _async(process_gone(pid)), f"episode process {pid} to end")
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
            with pytest.raises(grpc.aio.AioRpcError) as in_flight:  # the call its process died under
                await grpc_call(stub, doomed, "exit_process")
            assert in_flight.value.code() == grpc.StatusCode.ABORTED
            assert "exited with status 3" in in_flight.value.details()
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


async def test_episode_processes_are_forked_from_a_template_that_imported_the_environments() -> None:
    with start_serve(WORKER_PROBE, "--isolation", "episode", "--workers", "2") as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            sids = [await grpc_episode(stub, f"episode-{n}", env_name="workerprobeenv", secrets={"api_key": "s3cr3t"})
                    for n in range(3)]
            pids = [await grpc_pid(stub, sid) for sid in sids]
            importers = {await grpc_pid(stub, sid, "importer_pid") for sid in sids}
            assert len(importers) == 1  # one import, in the template, for every episode process
            (template,) = importers
            assert template not in pids and parent_of(template) == serve.proc.pid
            assert all(parent_of(pid) == template for pid in pids)
            # Secrets reach an episode process only over the hop: never in an argv or an environment.
            for pid in [template, *pids]:
                for what in ("cmdline", "environ"):
                    assert b"s3cr3t" not in Path(f"/proc/{pid}/{what}").read_bytes()


async def test_an_episode_process_killed_from_outside_is_named_by_its_signal_and_costs_only_its_episode() -> None:
    with start_serve(WORKER_PROBE, "--isolation", "episode", "--workers", "2") as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            doomed = await grpc_episode(stub, "doomed", env_name="workerprobeenv")
            neighbour = await grpc_episode(stub, "neighbour", env_name="workerprobeenv")
            os.kill(await grpc_pid(stub, doomed), signal.SIGSEGV)

            await eventually(functools.partial(refuses_prompts, stub, doomed), "the episode to answer it crashed")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetPrompt(pb.GetPromptRequest(session_id=doomed))
            assert caught.value.code() == grpc.StatusCode.ABORTED and "killed by SIGSEGV" in caught.value.details()
            assert (await grpc_call(stub, neighbour, "echo_tag"))[-1].result.output.blocks[0].text.text == "neighbour"


async def test_episode_processes_log_tagged_with_their_worker_id(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with open(log, "w") as stderr, start_serve(WORKER_PROBE, "--isolation", "episode", stderr=stderr) as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            sid = await grpc_episode(stub, "logger", env_name="workerprobeenv")
            await grpc_call(stub, sid, "log_tag")

            async def logged() -> bool:
                return "probe_log tag=logger" in log.read_text()

            await eventually(logged, "the episode's log line")
    (line,) = [line for line in log.read_text().splitlines() if "probe_log tag=logger" in line]
    assert re.search(r" worker=\d+ logger=tests.support.worker_environments ", line), line


async def test_a_dead_template_costs_its_episode_processes_and_is_replaced_once_it_can_start(tmp_path: Path) -> None:
    poison, log = tmp_path / "poison", tmp_path / "serve.log"
    with log.open("w") as stderr, start_serve(WORKER_PROBE, "--isolation", "episode", "--workers", "2",
                                              env={POISON_VARIABLE: str(poison)}, stderr=stderr) as serve:
        async with grpc.aio.insecure_channel(serve.grpc_target) as channel, grpc_stub(serve.grpc_target) as stub:
            health = health_pb2_grpc.HealthStub(channel)

            async def health_is(status: int) -> bool:
                return (await health.Check(health_pb2.HealthCheckRequest())).status == status

            sid = await grpc_episode(stub, "orphan", env_name="workerprobeenv")
            template = await grpc_pid(stub, sid, "importer_pid")
            poison.write_text("poison")  # a new template cannot import the environments
            os.kill(template, signal.SIGKILL)

            await eventually(functools.partial(refuses_prompts, stub, sid), "the episode to answer it crashed")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
            assert caught.value.code() == grpc.StatusCode.ABORTED and "killed by SIGKILL" in caught.value.details()
            await eventually(lambda: health_is(health_pb2.HealthCheckResponse.NOT_SERVING), "health NOT_SERVING")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await grpc_episode(stub, "meanwhile", env_name="workerprobeenv")
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # retry later
            await eventually(lambda: _async(POISONED in log.read_text()), "a failed template start to be logged")
            poison.unlink()
            await eventually(lambda: health_is(health_pb2.HealthCheckResponse.SERVING), "health SERVING again")
            fresh = await grpc_episode(stub, "fresh", env_name="workerprobeenv")
            assert await grpc_pid(stub, fresh, "importer_pid") not in (template, serve.proc.pid)
    # The failed restarts are reported once, with the traceback, however many there were.
    assert log.read_text().count(POISONED) == 1, log.read_text()


async def test_the_server_killed_leaves_no_template_and_no_episode_process_behind(tmp_path: Path) -> None:
    with start_serve(WORKER_PROBE, "--isolation", "episode", "--workers", "2",
                     env={MARKER_DIR_VARIABLE: str(tmp_path)}) as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            sid = await grpc_episode(stub, "stuck", env_name="workerprobeenv")
            stuck = await grpc_pid(stub, sid)
            call = asyncio.ensure_future(grpc_call(stub, sid, "block_loop"))
            await eventually(lambda: _async((tmp_path / "blocking-stuck").exists()), "the episode's loop to block")
            processes = descendants(serve.proc.pid)
            assert stuck in processes and len(processes) >= 3  # the template, its pool, the stuck episode's
            serve.proc.kill()
            serve.proc.wait()
            # Nothing could tell the stuck process: it goes because its template went, because the server went.
            await eventually(lambda: _async(all(process_gone(pid) for pid in processes)), "every process to end")
            call.cancel()


async def _async(value: bool) -> bool:
    return value
