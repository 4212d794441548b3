"""reasoning-gym datasets through the MCP door: an orchestrator creates the episode of a
task over gRPC, the agent (the official MCP client) reads the question as the
instructions and answers with `submit`, the terminal tool; the reward is
reasoning-gym's own `score_answer` for the same entry."""

from __future__ import annotations

import json
from typing import Iterator

import grpc
import pytest
from mcp import Client

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from tests.support.reasoning_gym_play import FAMILIES, SERVE_SPEC, WRONG_ANSWER, entry, expected_reward
from tests.support.servers import ServeProcess, start_serve


@pytest.fixture(scope="module")
def reasoning_gym_server() -> Iterator[ServeProcess]:
    with start_serve(SERVE_SPEC, "--mcp-port", "0") as serve:
        yield serve


@pytest.mark.parametrize("family", FAMILIES)
async def test_an_agent_answers_each_family_through_the_mcp_door(reasoning_gym_server: ServeProcess,
                                                                  family: str) -> None:
    server = reasoning_gym_server
    async with grpc.aio.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        for index, right in [(0, True), (3, False)]:
            task = json.loads((await stub.GetTask(pb.GetTaskRequest(env_name=family, split="train",
                                                                     index=index))).task.spec.json)
            found = entry(task)["entry"]
            answer = found["answer"] if right else WRONG_ANSWER
            sid = (await stub.CreateSessionId(pb.CreateSessionIdRequest())).session_id
            request = pb.CreateEpisodeRequest(session_id=sid, env_name=family)
            request.task_spec.json = json.dumps(task)
            await stub.CreateEpisode(request)
            async with Client(f"{server.mcp_url}/{family}/mcp/{sid}") as agent:
                assert agent.instructions == found["question"]
                (submit,) = (await agent.list_tools()).tools
                result = await agent.call_tool("submit", {"answer": answer})
            assert submit.name == "submit" and submit.meta == {"ors/terminal": True}
            assert submit.input_schema["required"] == ["answer"]
            assert result.meta["ors/finished"] is True
            assert result.meta["ors/reward"] == expected_reward(task, answer)
            assert (result.meta["ors/reward"] == 1.0) is right
            await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
