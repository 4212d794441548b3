"""OpenEnv environments (tests/support/openenv_environments.py, on openenv-core's own
base classes) as ORS environments: hosted by `ors-grpc serve openenv:MODULE:CLASS` in
the server process and in --workers 2, and served by OpenEnv's own server and fronted
by `ors-grpc serve openenv:URL`; played over gRPC with ors_grpc.client, the
MCPEnvironment's tools through the MCP door with the official MCP client."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import subprocess
import sys
from typing import Any, Iterator

import grpc
import pytest
from mcp import Client
from openenv.core.generic_client import GenericEnvClient

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.adapters.openenv import observation_blocks
from ors_grpc.client import AsyncORSClient, ORSClient, ToolCallError
from tests.support.openenv_environments import CALCULATOR_ANSWER, PIXEL, GuessAction, secret_of
from tests.support.servers import ROOT, ServeProcess, start_script_server, start_serve

SUPPORT = "tests.support.openenv_environments"
HOSTED = (f"openenv:{SUPPORT}:GuessEnvironment?split=train:6:0&split=test:3:100",
          f"openenv:{SUPPORT}:SoloGuessEnvironment", f"openenv:{SUPPORT}:CalculatorEnvironment")
PLACEMENTS = {"in-process": ("--in-process",), "workers": ("--workers", "2")}
#: Seconds `serve` may take to start: every process that hosts an OpenEnv class imports
#: openenv-core, which imports gradio (seconds each, more on a loaded machine).
OPENENV_STARTUP_S = 180.0


@pytest.fixture(scope="module", params=list(PLACEMENTS))
def placement(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def hosted(placement: str) -> Iterator[ServeProcess]:
    with start_serve(*HOSTED, "--mcp-port", "0", *PLACEMENTS[placement], startup_timeout_s=OPENENV_STARTUP_S) as serve:
        yield serve


#: bench/openenv_server.py: OpenEnv's own server for a class, announcing its port as `serve` does.
OPENENV_SERVER = "import sys; from bench.openenv_server import main; main(sys.argv[1:])"


def openenv_server(env: str, action: str, observation: str) -> contextlib.AbstractContextManager[str]:
    """OpenEnv's own server for `env`; its URL."""
    return start_script_server(OPENENV_SERVER, f"{SUPPORT}:{env}", action, observation, name="OpenEnv's server")


@pytest.fixture(scope="module")
def guess_url() -> Iterator[str]:
    with openenv_server("GuessEnvironment", f"{SUPPORT}:GuessAction", f"{SUPPORT}:GuessObservation") as url:
        yield url


@pytest.fixture(scope="module")
def fronted(guess_url: str) -> Iterator[ServeProcess]:
    calculator = ("CalculatorEnvironment", "openenv.core.env_server.mcp_types:CallToolAction",
                  "openenv.core.env_server.mcp_types:CallToolObservation")
    with openenv_server(*calculator) as calculator_url:
        with start_serve(f"openenv:{guess_url}?split=train:6:0&split=test:3:100",
                         f"openenv:{calculator_url}?name=remote-calculator", "--mcp-port", "0",
                         startup_timeout_s=OPENENV_STARTUP_S) as serve:
            yield serve


def play_guessing_game(target: str, name: str = "guessenvironment") -> None:
    """Task 3 of train (seed 3) played wrong, then right; and the refusals."""
    with ORSClient(target) as client:
        env = client.environment(name)
        (step,) = env.list_tools()
        assert step.name == "step" and step.input_schema == GuessAction.model_json_schema()
        assert env.get_task("train", 3).task_spec == {"seed": 3} and env.get_task("test", 2).task_spec == {"seed": 102}
        secret = secret_of(3)
        with env.session(split="train", index=3) as session:
            prompt = json.loads(session.get_prompt()[0].text)
            assert prompt["message"] == "Guess my number from 0 to 9 (attempts: any)."
            wrong = session.call_tool("step", {"guess": (secret + 1) % 10})
            assert json.loads(wrong.blocks[0].text)["message"] in ("higher", "lower")
            assert (wrong.reward, wrong.finished) == (0.0, False)
            with pytest.raises(ToolCallError) as refused:
                session.call_tool("step", {"guess": 12})
            assert refused.value.reason == "input_validation"
            right = session.call_tool("step", {"guess": secret})
            assert json.loads(right.blocks[0].text)["message"] == "right"
            assert base64.b64decode(right.blocks[1].data) == PIXEL and right.blocks[1].mimeType == "image/png"
            assert (right.reward, right.finished) == (1.0, True)
            with pytest.raises(ToolCallError) as late:
                session.call_tool("step", {"guess": secret})
            assert late.value.reason == "episode_finished"
        # The task spec is reset's keyword arguments.
        with env.session({"seed": 3, "attempts": 5}) as session:
            assert json.loads(session.get_prompt()[0].text)["message"].endswith("(attempts: 5).")


def test_a_hosted_environment_plays_to_the_rewards_its_step_gives(hosted: ServeProcess) -> None:
    play_guessing_game(hosted.grpc_target)
    with ORSClient(hosted.grpc_target) as client:
        with client.environment("guessenvironment").session(split="test", index=0) as session:
            assert session.call_tool("step", {"guess": secret_of(100)}).metadata == {"steps": 1}


async def test_episodes_overlap_where_the_environment_allows_it_and_take_turns_where_not(
        hosted: ServeProcess, placement: str) -> None:
    # An environment without concurrent sessions has one live instance per process: in
    # the server process its episodes take turns; workers are processes of their own.
    in_process = placement == "in-process"
    async with AsyncORSClient(hosted.grpc_target) as client:
        for name, overlapping in [("guessenvironment", True), ("sologuessenvironment", False)]:
            env = client.environment(name)
            async with env.session(split="train", index=0) as first:
                others = json.loads((await first.get_prompt())[0].text).get("others_live", 0)
                assert others == 0
                second = env.session(split="train", index=1)
                await second.__aenter__()
                prompt = asyncio.ensure_future(second.get_prompt())
                await asyncio.sleep(1.0)
                if in_process:
                    assert prompt.done() is overlapping
            try:
                # Without overlap the second episode is set up only once the first has ended.
                second_others = json.loads((await prompt)[0].text).get("others_live", 0)
            finally:
                await second.__aexit__(None, None, None)
            if not overlapping:
                assert second_others == 0
            elif in_process:
                assert second_others == 1


async def test_an_mcp_environments_tools_are_the_episodes_tools_through_the_mcp_door(hosted: ServeProcess) -> None:
    await play_calculator(hosted, "calculatorenvironment")


async def play_calculator(server: ServeProcess, name: str) -> None:
    async with grpc.aio.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        sid = (await stub.CreateSessionId(pb.CreateSessionIdRequest())).session_id
        request = pb.CreateEpisodeRequest(session_id=sid, env_name=name)
        request.task_spec.json = json.dumps({"seed": 7})
        await stub.CreateEpisode(request)
        async with Client(f"{server.mcp_url}/{name}/mcp/{sid}") as agent:
            assert agent.instructions == "Compute, then answer (seed 7)."
            tools = {tool.name: tool for tool in (await agent.list_tools()).tools}
            added = await agent.call_tool("add", {"a": 2, "b": 3})
            bad = await agent.call_tool("add", {"a": "two"})
            picture = await agent.call_tool("picture", {})
            wrong = await agent.call_tool("answer", {"value": CALCULATOR_ANSWER + 1})
        assert set(tools) == {"add", "picture", "answer"}
        assert tools["add"].input_schema["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}
        assert added.content[0].text == "5" and added.meta["ors/finished"] is False
        assert "validation error" in bad.content[0].text and not bad.meta["ors/finished"]
        assert picture.content[0].type == "image" and base64.b64decode(picture.content[0].data) == PIXEL
        assert wrong.content[0].text == "wrong"
        assert wrong.meta["ors/reward"] == 0.0 and wrong.meta["ors/finished"] is True
        await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
    with ORSClient(server.grpc_target) as client:
        with client.environment(name).session(split="train", index=0) as session:
            right = session.call_tool("answer", {"value": CALCULATOR_ANSWER})
            assert (right.blocks[0].text, right.reward, right.finished) == ("right", 1.0, True)


def test_a_running_openenv_server_fronted_by_url_plays_as_its_own_client_sees_it(
        fronted: ServeProcess, guess_url: str) -> None:
    play_guessing_game(fronted.grpc_target)

    async def direct() -> tuple[Any, Any]:
        async with GenericEnvClient(base_url=guess_url) as env:
            first = await env.reset(seed=4)
            return first, await env.step({"guess": secret_of(4)})

    first, last = asyncio.run(direct())
    with ORSClient(fronted.grpc_target) as client:
        with client.environment("guessenvironment").session(split="train", index=4) as session:
            assert session.get_prompt() == observation_blocks(first.observation)
            output = session.call_tool("step", {"guess": secret_of(4)})
    assert output.blocks == observation_blocks(last.observation)
    assert (output.reward, output.finished) == (last.reward, last.done) == (1.0, True)


async def test_a_fronted_mcp_environments_tools_are_the_episodes_tools(fronted: ServeProcess) -> None:
    await play_calculator(fronted, "remote-calculator")


def test_a_fronted_server_plays_from_worker_processes_too(guess_url: str) -> None:
    with start_serve(f"openenv:{guess_url}?split=train:6:0&split=test:3:100", "--workers", "2",
                     startup_timeout_s=OPENENV_STARTUP_S) as serve:
        play_guessing_game(serve.grpc_target)


def test_the_benchmark_fronts_and_hosts_an_openenv_server_without_errors() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--ecosystems", "--workers", "2", "--warmup", "0", "--duration", "0.5",
         "--rounds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout.split("## Other ecosystems")[1].splitlines()[2:9]
    rows = {line[:20].strip(): line[20:].split() for line in table}
    for label in ("OpenEnv direct", "OpenEnv fronted", "OpenEnv direct, 1", "OpenEnv fronted, 1", "OpenEnv hosted",
                  "reasoning-gym gRPC"):
        assert float(rows[label][0]) > 0 and rows[label][5] == "0", done.stdout
    assert "first error" not in done.stdout, done.stdout
    assert "fronting cost (2 workers): " in done.stdout and "fronting cost (1 worker): " in done.stdout, done.stdout
