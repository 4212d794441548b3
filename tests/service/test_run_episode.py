"""RunEpisode: a whole episode over one bidirectional stream, through the generated stubs."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import errors_pb2
from tests.support.grpc_calls import call_tool, error_reason

pytestmark = pytest.mark.timeout(60)


class Episode:
    """One RunEpisode call, one answer per step."""

    def __init__(self, stub: Any, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.call = stub.RunEpisode(metadata=metadata)

    async def step(self, **step: Any) -> pb.RunEpisodeResponse:
        await self.call.write(pb.RunEpisodeRequest(**step))
        return await self.call.read()

    async def create(self, env_name: str = "echoenv", session_id: str = "") -> pb.RunEpisodeResponse:
        """Train task 0 of `env_name`, in session `session_id` (empty: the server names it)."""
        task = pb.TaskIndex(split="train", index=0)
        return await self.step(create=pb.CreateEpisodeRequest(session_id=session_id, env_name=env_name, task_index=task))

    async def call_tool(self, name: str, tool_input: Any = None, task_id: str = "") -> pb.RunEpisodeResponse:
        call = pb.ToolCallStep(name=name, task_id=task_id or uuid.uuid4().hex)
        if tool_input is not None:
            call.input.json = json.dumps(tool_input)
        return await self.step(call_tool=call)

    async def end(self) -> grpc.StatusCode:
        """Half-close; the status the server ends the stream with."""
        await self.call.done_writing()
        assert await self.call.read() is grpc.aio.EOF
        return await self.call.code()


def text_of(answer: pb.RunEpisodeResponse) -> str:
    return answer.call_tool.result.output.blocks[0].text.text


def tool_calls_in_flight() -> float:
    """The in-process server's gauge of running tool calls (the test servers share this registry)."""
    return REGISTRY.get_sample_value("ors_tool_calls_in_flight", {"environment": "echoenv"}) or 0.0


async def open_sessions(stub: Any) -> int:
    return (await stub.Health(pb.HealthRequest())).open_sessions


async def test_a_whole_episode_runs_over_one_stream_and_the_delete_step_ends_it(stub) -> None:
    episode = Episode(stub)
    created = await episode.create()
    sid = created.create.session_id
    assert uuid.UUID(sid).version == 4  # minted by the server: the request left it empty

    prompt = await episode.step(get_prompt=pb.GetPromptRequest())
    assert prompt.get_prompt.blocks[0].text.text == "Say hello"
    tools = await episode.step(list_task_tools=pb.ListTaskToolsRequest(session_id=sid))
    assert [t.name for t in tools.list_task_tools.tools][-1] == "hint"
    assert text_of(await episode.call_tool("echo", {"text": "hi"})) == "hi"
    submitted = await episode.call_tool("submit", {"answer": "hello"})
    assert submitted.call_tool.result.output.reward == 1.0 and submitted.call_tool.result.output.finished
    assert await open_sessions(stub) == 1

    deleted = await episode.step(delete=pb.DeleteEpisodeRequest())
    assert deleted.delete.session_id == sid
    assert await open_sessions(stub) == 0
    assert await episode.end() == grpc.StatusCode.OK


async def test_the_streams_episode_is_the_same_session_the_other_rpcs_see(stub) -> None:
    sid = str(uuid.uuid4())
    episode = Episode(stub, metadata=(("x-session-id", sid),))
    assert (await episode.create(session_id=sid)).create.session_id == sid
    assert text_of(await episode.call_tool("echo", {"text": "over the stream"})) == "over the stream"

    assert (await stub.Ping(pb.PingRequest(session_id=sid))).status == "ok"
    _, event = await call_tool(stub, sid, "echo", {"text": "by CallTool"})
    assert event.result.output.blocks[0].text.text == "by CallTool"
    await episode.step(delete=pb.DeleteEpisodeRequest())
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await stub.Ping(pb.PingRequest(session_id=sid))
    assert error_reason(gone.value) == "ERROR_REASON_SESSION_NOT_FOUND"
    # The metadata routes the stream; it never names a later episode.
    assert (await episode.create()).create.session_id not in ("", sid)
    await episode.step(delete=pb.DeleteEpisodeRequest())
    await episode.end()


async def test_a_failed_step_is_answered_with_its_error_and_the_stream_goes_on(stub) -> None:
    episode = Episode(stub)
    too_early = await episode.step(get_prompt=pb.GetPromptRequest())
    assert too_early.error.reason == errors_pb2.ERROR_REASON_INVALID_REQUEST
    assert too_early.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "create one first" in too_early.error.message

    unknown_env = await episode.create("nosuchenv")
    assert unknown_env.error.reason == errors_pb2.ERROR_REASON_UNKNOWN_ENVIRONMENT
    assert unknown_env.error.code == grpc.StatusCode.NOT_FOUND.value[0]
    sid = (await episode.create()).create.session_id
    again = await episode.create()
    assert again.error.reason == errors_pb2.ERROR_REASON_INVALID_REQUEST and "still open" in again.error.message

    other = await episode.step(get_prompt=pb.GetPromptRequest(session_id="someone-else"))
    assert "not this stream's episode" in other.error.message
    raised = await episode.call_tool("fail")
    assert raised.call_tool.failure.message == "boom"  # the tool raised; the session lives on
    refused = await episode.call_tool("nosuchtool")
    assert "not a valid tool" in refused.call_tool.result.error
    await episode.call_tool("echo", {"text": "a"}, task_id="mine")
    reused = await episode.call_tool("echo", {"text": "b"}, task_id="mine")
    assert reused.error.reason == errors_pb2.ERROR_REASON_INVALID_REQUEST and "already in use" in reused.error.message
    no_id = await episode.step(call_tool=pb.ToolCallStep(name="echo"))
    assert no_id.error.reason == errors_pb2.ERROR_REASON_INVALID_REQUEST
    empty = await episode.step()
    assert "no step" in empty.error.message

    assert text_of(await episode.call_tool("echo", {"text": "still here"})) == "still here"
    assert (await episode.step(delete=pb.DeleteEpisodeRequest(session_id=sid))).delete.session_id == sid
    assert await episode.end() == grpc.StatusCode.OK


async def test_a_setup_failure_answers_the_steps_that_wait_for_setup(stub) -> None:
    episode = Episode(stub)
    await episode.create("failingsetupenv")
    failed = await episode.step(get_prompt=pb.GetPromptRequest())
    assert failed.error.reason == errors_pb2.ERROR_REASON_SETUP_FAILED
    await episode.step(delete=pb.DeleteEpisodeRequest())
    await episode.end()


async def test_a_broken_stream_leaves_the_episode_and_its_running_call_reachable(stub) -> None:
    episode = Episode(stub)
    sid = (await episode.create()).create.session_id
    in_flight_before = tool_calls_in_flight()
    await episode.call.write(pb.RunEpisodeRequest(call_tool=pb.ToolCallStep(
        name="sleep", input={"json": json.dumps({"seconds": 1.0})}, task_id="the-nap"
    )))
    async with asyncio.timeout(10):  # until the server runs the call (a fixed sleep races a loaded machine)
        while tool_calls_in_flight() == in_flight_before:
            await asyncio.sleep(0.01)
    episode.call.cancel()

    # Attach by the task id the client chose: the tool ran on and answers once.
    task_id, event = await call_tool(stub, sid, "sleep", task_id="the-nap")
    assert task_id == "the-nap" and event.result.output.blocks[0].text.text == "slept"
    assert await open_sessions(stub) == 1
    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
    assert await open_sessions(stub) == 0


async def test_one_stream_runs_episodes_one_after_another(stub) -> None:
    episode = Episode(stub)
    first = (await episode.create()).create.session_id
    assert text_of(await episode.call_tool("echo", {"text": "one"})) == "one"
    await episode.step(delete=pb.DeleteEpisodeRequest())
    after_delete = await episode.step(get_prompt=pb.GetPromptRequest())
    assert after_delete.error.reason == errors_pb2.ERROR_REASON_INVALID_REQUEST  # no episode until the next create

    second = (await episode.create()).create.session_id
    assert second != first  # both minted by the server
    assert text_of(await episode.call_tool("echo", {"text": "two"})) == "two"
    assert await open_sessions(stub) == 1
    await episode.step(delete=pb.DeleteEpisodeRequest())
    assert await open_sessions(stub) == 0
    assert await episode.end() == grpc.StatusCode.OK


async def test_half_closing_without_a_delete_step_leaves_the_episode_open(stub) -> None:
    episode = Episode(stub)
    sid = (await episode.create()).create.session_id
    assert await episode.end() == grpc.StatusCode.OK
    assert (await stub.Ping(pb.PingRequest(session_id=sid))).status == "ok"
    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))

