"""The in-process channel behaves like a network channel to the same server.

`ors-grpc serve --http-port` hands the bridge an `InProcessChannel`; these
tests run the same calls through it and through a real loopback channel and
expect the same answers, errors (code, details, `ors-error-reason`), API key
checks and tool-call semantics.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.server import ServerConfig, create_server, in_process_channel
from tests.support.grpc_calls import TEST_ENVIRONMENTS, call_tool, create_episode, error_reason, tool_call

API_KEY = "in-process-key"
KEY = (("x-api-key", API_KEY),)


class Stubs:
    """A stub over the network and one in-process, onto one server."""

    def __init__(self, network: pb_grpc.EnvironmentServiceStub, in_process: pb_grpc.EnvironmentServiceStub):
        self.network = network
        self.in_process = in_process
        self.both = (network, in_process)


@contextlib.asynccontextmanager
async def stubs(config: ServerConfig = ServerConfig()) -> AsyncIterator[Stubs]:
    server, port = await create_server(TEST_ENVIRONMENTS, "127.0.0.1:0", config=config)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Stubs(
                pb_grpc.EnvironmentServiceStub(channel),
                pb_grpc.EnvironmentServiceStub(in_process_channel(server)),
            )
    finally:
        await server.stop(None)


async def failure_of(call) -> tuple[grpc.StatusCode, str, str | None]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    error = caught.value
    return error.code(), error.details(), error_reason(error)


async def stream_failure_of(stream) -> tuple[grpc.StatusCode, str, str | None]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in stream:
            pass
    error = caught.value
    return error.code(), error.details(), error_reason(error)


async def test_unary_answers_are_the_same():
    async with stubs() as s:
        network, in_process = (
            [await stub.ListTools(pb.ListToolsRequest(env_name="EchoEnv")) for stub in s.both]
        )
        assert network == in_process
        sid = await create_episode(s.in_process)
        prompts = [await stub.GetPrompt(pb.GetPromptRequest(session_id=sid)) for stub in s.both]
        assert prompts[0] == prompts[1]


async def test_unary_errors_carry_the_same_code_details_and_reason():
    async with stubs() as s:
        unknown_env = [await failure_of(stub.ListSplits(pb.ListSplitsRequest(env_name="nope"))) for stub in s.both]
        assert unknown_env[0] == unknown_env[1]
        assert unknown_env[0] == (grpc.StatusCode.NOT_FOUND, "unknown environment 'nope'; this server hosts: echoenv, slowsetupenv, failingsetupenv",
                                  "ERROR_REASON_UNKNOWN_ENVIRONMENT")
        no_session = [await failure_of(stub.Ping(pb.PingRequest(session_id="missing"))) for stub in s.both]
        assert no_session[0] == no_session[1]
        assert no_session[0][2] == "ERROR_REASON_SESSION_NOT_FOUND"


async def test_a_tool_call_streams_the_same_events():
    async with stubs() as s:
        sid = await create_episode(s.in_process)
        results = [(await call_tool(stub, sid, "add", {"a": 2, "b": 40}))[1] for stub in s.both]
        assert results[0] == results[1]
        assert results[0].result.output.blocks[0].text.text == "42"


async def test_an_unknown_task_id_fails_the_same_way():
    async with stubs() as s:
        sid = await create_episode(s.in_process)
        failures = [
            await stream_failure_of(stub.CallTool(pb.CallToolRequest(
                session_id=sid, call=tool_call("echo", {"text": "x"}, task_id="0" * 32))))
            for stub in s.both
        ]
        assert failures[0] == failures[1]
        assert failures[0] == (grpc.StatusCode.NOT_FOUND, "unknown task_id", "ERROR_REASON_UNKNOWN_TASK_ID")


async def test_the_api_key_is_checked_on_unary_and_streaming_calls():
    async with stubs(ServerConfig(api_key=API_KEY)) as s:
        refused = [await failure_of(stub.ListEnvironments(pb.ListEnvironmentsRequest())) for stub in s.both]
        assert refused[0] == refused[1]
        assert refused[0][0] == grpc.StatusCode.UNAUTHENTICATED
        sid = (await s.in_process.CreateSessionId(pb.CreateSessionIdRequest(), metadata=KEY)).session_id
        streams = [
            await stream_failure_of(stub.CallTool(pb.CallToolRequest(session_id=sid, call=tool_call("fail"))))
            for stub in s.both
        ]
        assert streams[0] == streams[1]
        assert streams[0][0] == grpc.StatusCode.UNAUTHENTICATED
        names = await s.in_process.ListEnvironments(pb.ListEnvironmentsRequest(), metadata=KEY)
        assert "echoenv" in names.names


async def test_cancelling_an_in_process_stream_leaves_the_tool_running():
    async with stubs() as s:
        sid = await create_episode(s.in_process)
        request = pb.CallToolRequest(session_id=sid, call=tool_call("sleep", {"seconds": 0.3}))
        stream = s.in_process.CallTool(request)
        first = await stream.read()
        stream.cancel()
        await asyncio.sleep(0)  # let the cancellation reach the handler
        task_id, last = await call_tool(s.network, sid, "sleep", task_id=first.task_id)
        assert task_id == first.task_id
        assert last.result.output.blocks[0].text.text == "slept"


async def sleeping_in_process(seconds: float) -> tuple[grpc.aio.Server, Any]:
    """A server, and an in-process call of its `sleep` tool whose task id has been read."""
    server, _ = await create_server(TEST_ENVIRONMENTS, "127.0.0.1:0")
    stub = pb_grpc.EnvironmentServiceStub(in_process_channel(server))
    sid = await create_episode(stub)
    stream = stub.CallTool(pb.CallToolRequest(session_id=sid, call=tool_call("sleep", {"seconds": seconds})))
    assert (await stream.read()).task_id
    return server, stream


async def test_stopping_the_server_lets_in_process_tool_calls_finish_within_the_grace():
    server, stream = await sleeping_in_process(0.5)
    stopping = asyncio.create_task(server.stop(5))
    last = await stream.read()
    assert last.result.output.blocks[0].text.text == "slept"
    await stopping


async def test_stopping_without_grace_ends_in_process_tool_calls_at_once():
    server, stream = await sleeping_in_process(60)
    await server.stop(None)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stream.read()
    assert error_reason(caught.value) == "ERROR_REASON_SESSION_DELETED"


async def test_run_episode_is_not_served_in_process():
    # The bridge makes one call per step; a stub calling RunEpisode in process gets a clear refusal.
    async with stubs() as s:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            s.in_process.RunEpisode()
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "RunEpisode" in refused.value.details()
