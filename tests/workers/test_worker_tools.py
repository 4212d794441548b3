"""An environment's own choices hold when its code runs in worker processes
(`--workers N`, `--isolation episode`): where its sync code runs
(`sync_code_on_loop`), and which tool calls may overlap (concurrent,
exclusive and terminal tools, a toolset's tools). The server decides the
second from the tool's marks on the class; the tools run in the worker.

The concurrency tests steer the dialect environment's `wait_*` tools through
files (`entered_in`, `release_in`), the worker being another process; "has
not started" is checked after a generous 0.6 s, as in-process
(tests/service/test_openreward_surface.py, whose scenarios these are).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc.client import AsyncORSClient, ToolCallError
from tests.support import openreward_dialect_env as dialect
from tests.support.reliability_helpers import grpc_call, grpc_episode, grpc_stub
from tests.support.servers import ServeProcess, start_serve

pytestmark = pytest.mark.timeout(120)

#: The two ways of running environments' code apart from the server.
MODES = {"workers": ("--workers", "1"), "episode-isolation": ("--isolation", "episode", "--workers", "1")}
TASK = {"question": "What is 2+2?", "answer": "4"}
NOT_YET_S = 0.6  # how long a call that must wait is watched not starting
EVENT_TIMEOUT_S = 20.0


# --- where sync code runs ----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_an_environment_that_pins_its_sync_code_keeps_its_choice_in_a_worker(mode: str) -> None:
    environments = ["tests.support.worker_environments:LoopPinnedEnv",
                    "tests.support.worker_environments:ThreadPinnedEnv"]
    with start_serve(*environments, *MODES[mode]) as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            for env_name, expected in [("looppinnedenv", "loop"), ("threadpinnedenv", "thread")]:
                sid = await grpc_episode(stub, env_name, env_name=env_name)
                await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
                events = await grpc_call(stub, sid, "where")
                ran_in = json.loads(events[-1].result.output.metadata.json)
                assert ran_in == dict.fromkeys(["constructor", "setup", "get_prompt", "tool"], expected), env_name


# --- who waits for whom ------------------------------------------------------------


@pytest.fixture(params=MODES)
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ServeProcess, Path]]:
    """The dialect environment and its registered toolset served in `mode`, steered through a folder."""
    with start_serve("tests.support.openreward_dialect_env:OpenRewardEnv",
                     "--toolset", "tests.support.openreward_dialect_env:GraderToolset", *MODES[request.param],
                     env={dialect.STEERING_DIR_VARIABLE: str(tmp_path)}) as serve:
        yield serve, tmp_path


async def wait_until(predicate: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), EVENT_TIMEOUT_S)


async def still_not_entered(folder: Path, *tags: str) -> None:
    await asyncio.sleep(NOT_YET_S)
    assert not set(tags) & dialect.entered_in(folder)


def _start(session: Any, name: str, tag: str) -> asyncio.Task:
    return asyncio.ensure_future(session.call_tool(name, {"tag": tag}))


async def test_concurrent_tools_of_a_toolset_run_together_and_plain_tools_take_turns(
    served: tuple[ServeProcess, Path],
) -> None:
    serve, folder = served

    async with AsyncORSClient(serve.grpc_target, stream_episodes=False) as client:
        async with client.environment("openrewardenv").session(TASK, toolset="GraderToolset") as session:
            reads = [_start(session, "wait_read", tag) for tag in ("read-1", "read-2")]  # the toolset's
            await wait_until(lambda: {"read-1", "read-2"} <= dialect.entered_in(folder))  # both inside at once
            steps = [_start(session, "wait_step", tag) for tag in ("step-1", "step-2")]
            await wait_until(lambda: bool({"step-1", "step-2"} & dialect.entered_in(folder)))
            first, second = ("step-1", "step-2") if "step-1" in dialect.entered_in(folder) else ("step-2", "step-1")
            await still_not_entered(folder, second)
            dialect.release_in(folder, first)
            await wait_until(lambda: second in dialect.entered_in(folder))
            for tag in ("read-1", "read-2", second):
                dialect.release_in(folder, tag)
            outputs = await asyncio.gather(*reads, *steps)
    assert [o.blocks[0].text for o in outputs] == [
        "toolset read read-1 done", "toolset read read-2 done", "step step-1 done", "step step-2 done"]


@pytest.mark.parametrize("exclusive", ["wait_commit", "submit"])
async def test_an_exclusive_or_terminal_tool_waits_for_calls_in_flight_and_holds_later_ones(
    served: tuple[ServeProcess, Path], exclusive: str,
) -> None:
    serve, folder = served

    async with AsyncORSClient(serve.grpc_target, stream_episodes=False) as client:
        async with client.environment("openrewardenv").session(TASK) as session:
            in_flight = [_start(session, "wait_read", "early-read"), _start(session, "wait_step", "early-step")]
            await wait_until(lambda: {"early-read", "early-step"} <= dialect.entered_in(folder))
            if exclusive == "submit":
                writer, writer_tag = asyncio.ensure_future(session.call_terminal_tool("4")), "submit"
            else:
                writer, writer_tag = _start(session, "wait_commit", "commit"), "commit"
            await still_not_entered(folder, writer_tag)
            # Writer-preferring: a concurrent call arriving now waits behind the queued exclusive one.
            late = _start(session, "wait_read", "late-read")
            await still_not_entered(folder, writer_tag, "late-read")
            dialect.release_in(folder, "early-read")
            await still_not_entered(folder, writer_tag, "late-read")  # early-step is still inside
            dialect.release_in(folder, "early-step")
            await wait_until(lambda: writer_tag in dialect.entered_in(folder))
            if exclusive == "wait_commit":
                await still_not_entered(folder, "late-read")
                dialect.release_in(folder, "commit")
                await wait_until(lambda: "late-read" in dialect.entered_in(folder))
                dialect.release_in(folder, "late-read")
                assert (await late).blocks[0].text == "read late-read done"
            else:
                # The terminal tool finished the episode: the held call is refused without running.
                with pytest.raises(ToolCallError) as caught:
                    await late
                assert caught.value.reason == "episode_finished" and "late-read" not in dialect.entered_in(folder)
            assert (await writer).blocks[0].text in ("commit commit done", "correct")
            await asyncio.gather(*in_flight)
