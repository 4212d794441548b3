"""A constructor that raises fails the creation itself, on every way of creating
an episode (CreateEpisode, a RunEpisode `create` step, a claimed warm episode,
the Python client's session): no episode is left behind, as under openreward."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from pydantic import BaseModel

from ors_grpc import TextBlock, ToolOutput, Toolset, tool
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc.client import AsyncORSClient, ORSServerError
from ors_grpc.server import ServerConfig, create_server
from tests.support.environments import EchoEnv
from tests.support.grpc_calls import error_reason, expect_error, serving
from tests.support.warm_environments import WarmEnv

pytestmark = pytest.mark.timeout(60)


class LockerTask(BaseModel):
    question: str


class StrictEnv(EchoEnv):
    """Validates its task spec in the constructor, with pydantic."""

    def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        self.task = LockerTask.model_validate(task_spec)


class PickyToolset(Toolset):
    """Refuses (ValueError) an environment whose task asks for it, breaks on another."""

    def __init__(self, env: EchoEnv) -> None:
        if env.task_spec.get("refuse"):
            raise ValueError("this toolset needs a sandbox")
        if env.task_spec.get("break"):
            raise KeyError("pad")
        self.env = env

    @tool
    def scribble(self) -> ToolOutput:
        """Scribble."""
        return ToolOutput(blocks=[TextBlock(text="scribbled")])


class BrittleWarmEnv(WarmEnv):
    """A warm environment whose constructor rejects the tag `bad`."""

    def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        if self.tag == "bad":
            raise ValueError("tag 'bad' is not a locker")


def create_request(sid: str, env_name: str, task_spec: dict, toolset_name: str | None = None):
    request = pb.CreateEpisodeRequest(session_id=sid, env_name=env_name, toolset_name=toolset_name)
    request.task_spec.json = json.dumps(task_spec)
    return request


async def open_sessions(stub) -> int:
    return (await stub.Health(pb.HealthRequest())).open_sessions


async def test_a_rejected_task_spec_fails_create_episode_and_leaves_no_session() -> None:
    async with serving([StrictEnv], ServerConfig(max_sessions=1)) as stub:
        for _ in range(2):  # a failed creation holds no slot of max_sessions
            error = await expect_error(stub.CreateEpisode(create_request("v-1", "strictenv", {"id": 1})))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert error_reason(error) == "ERROR_REASON_SETUP_FAILED"
            assert error.details().startswith("ValidationError: 1 validation error for LockerTask\nquestion")
        assert await open_sessions(stub) == 0
        gone = await expect_error(stub.Ping(pb.PingRequest(session_id="v-1")))
        assert (gone.code(), gone.details()) == (
            grpc.StatusCode.NOT_FOUND, "Active environment not found: no open episode has session id 'v-1'")
        await stub.CreateEpisode(create_request("v-1", "strictenv", {"id": 1, "question": "Open?"}))
        assert (await stub.Ping(pb.PingRequest(session_id="v-1"))).status == "ok"


async def test_a_run_episode_create_step_answers_the_constructor_failure_and_the_stream_goes_on() -> None:
    async with serving([StrictEnv]) as stub:
        stream = stub.RunEpisode()
        rejected = create_request("", "strictenv", {"id": 1})
        await stream.write(pb.RunEpisodeRequest(create=rejected))
        answer = await stream.read()
        assert answer.error.reason == errors_pb2.ERROR_REASON_SETUP_FAILED
        assert answer.error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert answer.error.message.startswith("ValidationError: ")
        await stream.write(pb.RunEpisodeRequest(create=create_request("", "strictenv", {"question": "Open?"})))
        created = await stream.read()
        assert created.WhichOneof("step") == "create" and created.create.session_id
        await stream.write(pb.RunEpisodeRequest(delete=pb.DeleteEpisodeRequest()))
        assert (await stream.read()).WhichOneof("step") == "delete"
        await stream.done_writing()
        assert await open_sessions(stub) == 0


async def test_a_session_toolset_that_refuses_or_breaks_fails_the_creation() -> None:
    async with serving([EchoEnv], toolsets=[PickyToolset]) as stub:
        refused = await expect_error(stub.CreateEpisode(
            create_request("t-1", "echoenv", {"id": 0, "refuse": True}, toolset_name="PickyToolset")))
        assert (refused.code(), error_reason(refused), refused.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT, "ERROR_REASON_TOOLSET_REFUSED", "this toolset needs a sandbox")
        broken = await expect_error(stub.CreateEpisode(
            create_request("t-2", "echoenv", {"id": 0, "break": True}, toolset_name="PickyToolset")))
        assert (broken.code(), error_reason(broken), broken.details()) == (
            grpc.StatusCode.FAILED_PRECONDITION, "ERROR_REASON_SETUP_FAILED", "KeyError: 'pad'")
        empty = await expect_error(stub.CreateEpisode(
            create_request("t-3", "echoenv", {"id": 0}, toolset_name="")))
        assert (error_reason(empty), empty.details()) == (
            "ERROR_REASON_UNKNOWN_TOOLSET", "unknown toolset ''; valid options are ['PickyToolset']")
        assert await open_sessions(stub) == 0


async def test_a_prepared_episode_whose_constructor_failed_fails_its_claim_as_a_fresh_one_does() -> None:
    server, port = await create_server([BrittleWarmEnv], "127.0.0.1:0")
    try:
        async with AsyncORSClient(f"127.0.0.1:{port}") as client:
            env = client.environment("brittlewarmenv")
            await env.prepare([{"tag": "bad"}])
            errors = []
            for _ in range(2):  # the claim, then a fresh episode
                with pytest.raises(ORSServerError) as failed:
                    async with env.session({"tag": "bad"}):
                        pytest.fail("the session opened on a task its constructor rejects")
                errors.append((failed.value.code, failed.value.reason, failed.value.message))
            assert errors[0] == errors[1] == (
                grpc.StatusCode.FAILED_PRECONDITION, "ERROR_REASON_SETUP_FAILED", "ValueError: tag 'bad' is not a locker"
            )
            health = await client.health()
            assert health.open_sessions == 0
    finally:
        await server.stop(None)


async def test_setup_keeps_running_after_the_creation_answered() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    class SlowLockerEnv(StrictEnv):
        async def setup(self) -> None:
            started.set()
            await release.wait()

    async with serving([SlowLockerEnv]) as stub:
        await stub.CreateEpisode(create_request("s-1", "slowlockerenv", {"question": "Open?"}))
        await asyncio.wait_for(started.wait(), 10)
        prompt = asyncio.ensure_future(stub.GetPrompt(pb.GetPromptRequest(session_id="s-1")))
        assert (await stub.Ping(pb.PingRequest(session_id="s-1"))).status == "ok"
        assert not prompt.done()
        release.set()
        assert (await prompt).blocks[0].text.text


class Notebook(Toolset):
    """A toolset an environment declares, whose constructor has a bug (a TypeError inside it)."""

    def __init__(self, env: EchoEnv) -> None:
        self.pages = len(env.task_spec) + "pages"  # type: ignore[operator]

    @tool
    def jot(self) -> ToolOutput:
        """Jot."""
        return ToolOutput(blocks=[TextBlock(text="jotted")])


class NotebookEnv(EchoEnv):
    toolsets = (Notebook,)


async def test_a_declared_toolset_whose_constructor_raises_reports_the_authors_error() -> None:
    """Not retried without the environment (which would hide the bug until the
    tool reports "not found"): the call fails with the constructor's TypeError."""
    async with serving([NotebookEnv]) as stub:
        await stub.CreateEpisode(create_request("n-1", "notebookenv", {"id": 0}))
        events = [event async for event in stub.CallTool(pb.CallToolRequest(session_id="n-1", call={"name": "jot"}))]
        assert events[-1].failure.message == "TypeError: unsupported operand type(s) for +: 'int' and 'str'"
