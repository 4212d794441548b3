"""A client built only on the betterproto stubs (grpclib: an independent gRPC implementation)
runs a full episode against `ors-grpc serve`."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Iterator

import betterproto
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ors_grpc_betterproto.ors.v1 import (
    CallToolRequest,
    CreateEpisodeRequest,
    CreateSessionIdRequest,
    DeleteEpisodeRequest,
    DeleteSessionIdRequest,
    EnvironmentServiceStub,
    GetPromptRequest,
    GetTaskRequest,
    HealthRequest,
    JsonValue,
    ListSplitsRequest,
    ListTaskToolsRequest,
    SplitType,
    TaskIndex,
    ToolCall,
    ToolOutput,
)
from tests.support.servers import ServeProcess, start_serve

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with start_serve("tests.support.environments:EchoEnv") as process:
        yield process


@pytest.fixture
async def stub(serve: ServeProcess) -> AsyncIterator[EnvironmentServiceStub]:
    host, port = serve.grpc_target.rsplit(":", 1)
    channel = Channel(host, int(port))
    try:
        yield EnvironmentServiceStub(channel)
    finally:
        channel.close()


async def call_tool(stub: EnvironmentServiceStub, sid: str, name: str, tool_input: dict) -> tuple[str, Any]:
    """Runs a tool; ("output", ToolOutput) | ("error", str) | ("failure", ToolFailure)."""
    request = CallToolRequest(session_id=sid, call=ToolCall(name=name, input=JsonValue(json=json.dumps(tool_input))))
    events = [event async for event in stub.call_tool(request, metadata={"x-session-id": sid})]
    kinds = [betterproto.which_one_of(event, "event")[0] for event in events]
    assert kinds[0] == "task_id" and len(kinds) == 2, kinds
    last = betterproto.which_one_of(events[1], "event")
    if last[0] == "result":
        return betterproto.which_one_of(last[1], "outcome")
    return last


def text_of(output: ToolOutput) -> str:
    return output.blocks[0].text.text


async def test_betterproto_client_full_episode(stub: EnvironmentServiceStub) -> None:
    assert (await stub.health(HealthRequest())).status == "ok"
    splits = (await stub.list_splits(ListSplitsRequest(env_name="echoenv"))).splits
    assert [(s.name, s.type) for s in splits] == [("train", SplitType.TRAIN), ("test", SplitType.TEST)]
    task = (await stub.get_task(GetTaskRequest(env_name="echoenv", split="test", index=0))).task
    answer = json.loads(task.spec.json)["answer"]

    sid = (await stub.create_session_id(CreateSessionIdRequest())).session_id
    meta = {"x-session-id": sid}
    create = CreateEpisodeRequest(session_id=sid, env_name="echoenv", task_index=TaskIndex(split="test", index=0))
    assert (await stub.create_episode(create, metadata=meta)).session_id == sid
    try:
        prompt = await stub.get_prompt(GetPromptRequest(session_id=sid), metadata=meta)
        assert prompt.blocks[0].text.text == "Say yes"
        tools = (await stub.list_task_tools(ListTaskToolsRequest(session_id=sid), metadata=meta)).tools
        assert {"echo", "image", "submit"} <= {t.name for t in tools}

        kind, added = await call_tool(stub, sid, "add", {"a": 20, "b": 22})
        assert kind == "output" and text_of(added) == "42" and added.reward == 0.0
        kind, echoed = await call_tool(stub, sid, "echo", {"text": "hi"})
        assert text_of(echoed) == "hi" and echoed.reward is None  # unset, not 0.0

        kind, error = await call_tool(stub, sid, "no_such_tool", {})
        assert kind == "error" and "no_such_tool" in error
        kind, failure = await call_tool(stub, sid, "fail", {})
        assert kind == "failure" and failure.message == "boom"

        kind, image = await call_tool(stub, sid, "image", {"size": 257})
        block = image.blocks[0]
        assert betterproto.which_one_of(block, "block")[0] == "image"
        assert block.image.mime_type == "image/png"
        assert block.image.data == bytes(i % 256 for i in range(257))
        assert json.loads(block.image.detail.json) == {"size": 257}

        kind, submitted = await call_tool(stub, sid, "submit", {"answer": answer})
        assert text_of(submitted) == "correct" and submitted.reward == 1.0 and submitted.finished
    finally:
        await stub.delete_episode(DeleteEpisodeRequest(session_id=sid), metadata=meta)
        await stub.delete_session_id(DeleteSessionIdRequest(session_id=sid), metadata=meta)

    with pytest.raises(GRPCError) as gone:
        await stub.get_prompt(GetPromptRequest(session_id=sid), metadata=meta)
    assert gone.value.status == Status.NOT_FOUND
