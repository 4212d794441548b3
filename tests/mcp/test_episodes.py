"""Full episodes through the MCP door with the official MCP Python client, in
both protocol generations: the handshake (2025-11-25) and the stateless
revision (2026-07-28)."""

from __future__ import annotations

import base64
import json
import urllib.parse

import aiohttp
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.version import LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from tests.support.environments import TRAIN_TASKS, image_bytes
from tests.support.mcp_door import (ENV, create_episode, episode_url, mcp_refusal, open_sessions, record,
                                    wait_for_open_sessions)
from tests.support.mcp_environment import TASK

#: (Client mode, the protocol revision it ends up speaking).
GENERATIONS = [("legacy", LATEST_HANDSHAKE_VERSION), ("auto", LATEST_MODERN_VERSION)]


@pytest.mark.parametrize(("mode", "revision"), GENERATIONS)
async def test_an_orchestrated_episode_runs_to_reward_one_and_its_record_tells_it(server, stub, mode, revision):
    sid = await create_episode(stub)
    async with Client(episode_url(server, sid), mode=mode) as agent:
        assert agent.protocol_version == revision
        assert agent.instructions == TASK["question"]
        tools = {tool.name: tool for tool in (await agent.list_tools()).tools}
        added = await agent.call_tool("add", {"a": 2, "b": 3})
        image = await agent.call_tool("image", {"size": 300})
        answered = await agent.call_tool("answer", {"answer": "5"})
        late = await agent.call_tool("add", {"a": 1, "b": 1})

    assert {"add", "image", "echo", "answer"} <= set(tools)
    assert tools["add"].input_schema["properties"].keys() == {"a", "b"}
    assert tools["answer"].meta == {"ors/terminal": True} and tools["answer"].input_schema["required"] == ["answer"]
    assert not added.is_error and added.content[0].text == "5"
    assert added.meta["ors/reward"] == 0.0 and added.meta["ors/finished"] is False
    assert image.content[0].type == "image" and image.content[0].mime_type == "image/png"
    assert base64.b64decode(image.content[0].data) == image_bytes(300)
    assert image.content[0].meta == {"ors/detail": {"size": 300}} and "ors/reward" not in image.meta
    assert answered.content[0].text == "correct"
    assert answered.meta["ors/reward"] == 1.0 and answered.meta["ors/finished"] is True
    assert late.is_error and late.meta["ors/reason"] == "episode_finished" and "finished" in late.content[0].text

    # The orchestrator reads the outcome; the door never ended the episode it did not make.
    kept = await record(stub, sid)
    assert kept.ended == pb.EPISODE_END_UNSPECIFIED
    assert [call.tool_name for call in kept.calls] == ["add", "image", "answer", "add"]
    assert kept.totals.finished and kept.totals.reward_sum == 1.0 and kept.totals.last_reward == 1.0
    assert json.loads(kept.calls[0].input.json) == {"a": 2, "b": 3}
    assert kept.calls[3].refusal_reason != 0
    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
    assert (await record(stub, sid)).ended == pb.EPISODE_END_DELETED

    # The same record over HTTP, during the linger after the end.
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server.http_url}/{ENV}/episode", headers={"X-Session-ID": sid}) as response:
            over_http = await response.json()
    assert over_http["ended"] == "deleted" and over_http["task"] == TASK
    assert [(c["tool_name"], c["reward"], c["finished"], c["refusal_reason"]) for c in over_http["calls"]] == [
        ("add", 0.0, False, None), ("image", None, False, None), ("answer", 1.0, True, None),
        ("add", None, False, "episode_finished")]
    assert over_http["totals"] == {"calls": 4, "reward_sum": 1.0, "last_reward": 1.0, "finished": True}


@pytest.mark.parametrize(("mode", "revision"), GENERATIONS)
async def test_the_task_prompt_holds_the_episodes_messages(server, stub, mode, revision):
    sid = await create_episode(stub)
    async with Client(episode_url(server, sid), mode=mode) as agent:
        prompts = (await agent.list_prompts()).prompts
        task = await agent.get_prompt("task")
        with pytest.raises(MCPError):
            await agent.get_prompt("another")
    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))

    assert [prompt.name for prompt in prompts] == ["task"]
    assert [(m.role, m.content.text, m.content.meta) for m in task.messages] == [
        ("user", "Answer with a number.", {"ors/role": "system"}),
        ("user", TASK["question"], None),
    ]


@pytest.mark.parametrize(("mode", "revision"), GENERATIONS)
async def test_a_tool_that_raises_is_an_error_result_and_the_episode_goes_on(server, stub, mode, revision):
    sid = await create_episode(stub)
    async with Client(episode_url(server, sid), mode=mode) as agent:
        failed = await agent.call_tool("fail", {})
        unknown = await agent.call_tool("no_such_tool", {})
        bad_input = await agent.call_tool("add", {"a": "two"})
        still = await agent.call_tool("add", {"a": 1, "b": 2})
    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))

    assert failed.is_error and failed.meta["ors/reason"] == "tool_error" and failed.content[0].text == "boom"
    assert unknown.is_error and unknown.meta["ors/reason"] == "not_found"
    assert bad_input.is_error and bad_input.meta["ors/reason"] == "input_validation"
    assert not still.is_error and still.content[0].text == "3"


@pytest.mark.parametrize(("mode", "revision"), GENERATIONS)
async def test_the_call_in_flight_when_its_process_dies_is_an_error_saying_environment_crashed(
        server, stub, mode, revision):
    sid = await create_episode(stub)
    async with Client(episode_url(server, sid), mode=mode) as agent:
        crashed = await agent.call_tool("crash_in_flight", {})
    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))

    assert crashed.is_error and crashed.meta["ors/reason"] == "environment_crashed"  # never `tool_error`
    assert crashed.content[0].text == ("the environment's worker process was killed by SIGSEGV; "
                                       "the episode's state is lost: start a new episode")


@pytest.mark.parametrize(("mode", "revision"), GENERATIONS)
async def test_an_episode_that_does_not_exist_is_refused(server, mode, revision):
    with mcp_refusal() as refused:
        async with Client(episode_url(server, "no-such-episode"), mode=mode) as agent:
            await agent.list_tools()
    assert "not found" in refused[0].error.message.lower()
    assert refused[0].error.data == {"ors/reason": "session_not_found"}


async def test_a_long_call_sends_progress_to_a_client_that_asked(server, stub):
    sid = await create_episode(stub)
    progress = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, message))

    async with Client(episode_url(server, sid), mode="legacy") as agent:
        slept = await agent.call_tool("sleep", {"seconds": 3}, progress_callback=on_progress)
    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
    assert slept.content[0].text == "slept"
    assert progress[:1] == [(2.0, "the tool is running")]  # every 2 s while it runs
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)


async def test_the_convenience_url_creates_its_episode_and_deletes_it_when_the_session_ends(server, stub):
    before = await open_sessions(stub)
    task = urllib.parse.quote(json.dumps({"question": "What is 1+1?", "answer": "2"}))
    async with Client(f"{server.mcp_url}/{ENV}/mcp?task={task}", mode="auto") as agent:
        assert agent.protocol_version == LATEST_HANDSHAKE_VERSION  # it needs the handshake
        assert agent.instructions == "What is 1+1?"
        assert await open_sessions(stub) == before + 1
        answered = await agent.call_tool("answer", {"answer": "2"})
    assert answered.meta["ors/reward"] == 1.0
    assert await wait_for_open_sessions(stub, before) == before

    async with Client(f"{server.mcp_url}/{ENV}/mcp?split=train&index=0", mode="legacy") as agent:
        assert agent.instructions == TRAIN_TASKS[0]["question"]
    assert await wait_for_open_sessions(stub, before) == before


async def test_the_convenience_url_is_refused_in_the_stateless_revision(server):
    with mcp_refusal() as refused:
        async with Client(f"{server.mcp_url}/{ENV}/mcp?split=train&index=0", mode=LATEST_MODERN_VERSION) as agent:
            await agent.list_tools()
    assert "initializes" in refused[0].error.message


async def test_a_convenience_url_without_a_task_is_refused(server, stub):
    before = await open_sessions(stub)
    with mcp_refusal() as refused:
        async with Client(f"{server.mcp_url}/{ENV}/mcp?split=train", mode="legacy"):
            pass
    assert "name the task" in refused[0].error.message
    assert await open_sessions(stub) == before
