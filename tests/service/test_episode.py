"""A full ORS episode over real gRPC, using only the generated stubs."""

from __future__ import annotations

import json

import grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc._generated.ors.v1 import types_pb2
from tests.support.environments import TRAIN_TASKS
from tests.support.servers import start_serve


def _call(name: str, tool_input: dict | None = None, task_id: str = "") -> types_pb2.ToolCall:
    call = types_pb2.ToolCall(name=name, task_id=task_id)
    if tool_input is not None:
        call.input.json = json.dumps(tool_input)
    return call


async def call_tool(stub, sid: str, name: str, tool_input: dict | None = None) -> list[pb.CallToolResponse]:
    request = pb.CallToolRequest(session_id=sid, call=_call(name, tool_input))
    return [event async for event in stub.CallTool(request)]


async def run_episode(stub: pb_grpc.EnvironmentServiceStub, create: pb.CreateEpisodeRequest) -> None:
    sid = (await stub.CreateSessionId(pb.CreateSessionIdRequest())).session_id
    create.session_id = sid
    assert (await stub.CreateEpisode(create)).session_id == sid

    prompt = await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
    assert prompt.blocks[0].text.text == "Say hello"
    tools = await stub.ListTaskTools(pb.ListTaskToolsRequest(session_id=sid))
    names = [tool.name for tool in tools.tools]
    assert names[-1] == "hint" and "echo" in names and "submit" in names

    echoed = await call_tool(stub, sid, "echo", {"text": "hi"})
    assert len(echoed[0].task_id) == 32
    assert echoed[1].result.output.blocks[0].text.text == "hi"
    assert not echoed[1].result.output.HasField("reward")
    added = await call_tool(stub, sid, "add", {"a": 2, "b": 3})
    assert added[1].result.output.blocks[0].text.text == "5"
    assert added[1].result.output.HasField("reward") and added[1].result.output.reward == 0.0

    assert (await stub.Ping(pb.PingRequest(session_id=sid))).status == "ok"
    submitted = await call_tool(stub, sid, "submit", {"answer": "hello"})
    assert submitted[1].result.output.reward == 1.0
    assert submitted[1].result.output.finished

    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
    await stub.DeleteSessionId(pb.DeleteSessionIdRequest(session_id=sid))


async def test_full_episode_from_task_spec(stub) -> None:
    create = pb.CreateEpisodeRequest(env_name="echoenv")
    create.task_spec.json = json.dumps(TRAIN_TASKS[0])
    await run_episode(stub, create)


async def test_full_episode_from_split_and_index(stub) -> None:
    create = pb.CreateEpisodeRequest(env_name="EchoEnv", task_index=pb.TaskIndex(split="train", index=0))
    await run_episode(stub, create)


async def test_full_episodes_against_serve_subprocess() -> None:
    with start_serve("tests.support.environments:EchoEnv") as serve:
        async with grpc.aio.insecure_channel(serve.grpc_target) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            from_index = pb.CreateEpisodeRequest(task_index=pb.TaskIndex(split="train", index=0))
            await run_episode(stub, from_index)
            from_spec = pb.CreateEpisodeRequest(env_name="echoenv")
            from_spec.task_spec.json = json.dumps(TRAIN_TASKS[0])
            await run_episode(stub, from_spec)
        assert serve.stop() == 0
