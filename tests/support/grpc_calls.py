"""Calls onto a real ORS gRPC server on loopback: start one (`serving`), make
episodes and calls on it, and read the errors it answers."""

from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator, Sequence

import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc.protocol.constants import ERROR_REASON_METADATA_KEY
from ors_grpc.server import ServerConfig, create_server
from tests.support.environments import EchoEnv, FailingSetupEnv, SlowSetupEnv

TEST_ENVIRONMENTS = [EchoEnv, SlowSetupEnv, FailingSetupEnv]


@contextlib.asynccontextmanager
async def serving(
    environments: Sequence[type] = TEST_ENVIRONMENTS, config: ServerConfig = ServerConfig(), toolsets: Any = ()
) -> AsyncIterator[pb_grpc.EnvironmentServiceStub]:
    """Start a server for `environments` (and `toolsets`) on a free loopback port; yield a stub onto it."""
    server, port = await create_server(environments, "127.0.0.1:0", config=config, toolsets=toolsets)
    try:
        options = [("grpc.max_receive_message_length", config.max_message_bytes),
                   ("grpc.max_send_message_length", config.max_message_bytes)]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            yield pb_grpc.EnvironmentServiceStub(channel)
    finally:
        await server.stop(None)


def tool_call(name: str, tool_input: Any = None, task_id: str = "") -> types_pb2.ToolCall:
    call = types_pb2.ToolCall(name=name, task_id=task_id)
    if tool_input is not None:
        call.input.json = json.dumps(tool_input)
    return call


async def create_episode(
    stub: pb_grpc.EnvironmentServiceStub, env_name: str = "echoenv", task_spec: Any = None,
    split: str = "train", index: int = 0, secrets: dict[str, str] | None = None,
) -> str:
    """Create an episode in a new session (from task_spec if given, else split+index)."""
    sid = (await stub.CreateSessionId(pb.CreateSessionIdRequest())).session_id
    request = pb.CreateEpisodeRequest(session_id=sid, env_name=env_name, secrets=secrets or {})
    if task_spec is not None:
        request.task_spec.json = json.dumps(task_spec, ensure_ascii=False)
    else:
        request.task_index.split, request.task_index.index = split, index
    await stub.CreateEpisode(request)
    return sid


async def call_tool(
    stub: pb_grpc.EnvironmentServiceStub, sid: str, name: str, tool_input: Any = None, task_id: str = ""
) -> tuple[str, pb.CallToolResponse]:
    """Run (or attach to) a call; its task id and final event."""
    request = pb.CallToolRequest(session_id=sid, call=tool_call(name, tool_input, task_id))
    events = [event async for event in stub.CallTool(request)]
    assert [e.WhichOneof("event") for e in events][:1] == ["task_id"] and len(events) == 2
    return events[0].task_id, events[1]


def error_reason(error: grpc.aio.AioRpcError) -> str | None:
    """The `ors-error-reason` trailing metadata entry of a failed call."""
    return dict(error.trailing_metadata() or ()).get(ERROR_REASON_METADATA_KEY)


async def expect_error(awaitable: Any) -> grpc.aio.AioRpcError:
    """Await a unary call (or drain a stream) that must fail; return the error."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if hasattr(awaitable, "__aiter__"):
            async for _ in awaitable:
                pass
        else:
            await awaitable
    return caught.value
