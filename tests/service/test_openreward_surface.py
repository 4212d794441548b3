"""The openreward surface (ORS.md section 5) over gRPC: an environment in the
openreward dialect served after swapping only its import, driven through the
service's RPCs and the Python client.

The concurrency tests steer tools that wait for the test to release them (the
server runs in the test's event loop), so they wait for events, not for
time; "has not started" is checked after a generous 0.6 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import types
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import grpc
import openreward.environments as openreward_environments
import pytest
from openreward.api.environments.client import Message as OpenRewardClientMessage
from openreward.api.environments.client import _parse_blocks, convert_messages
from pydantic import BaseModel

import ors_grpc
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc.client import (
    AsyncORSClient,
    GroupCandidate,
    GroupScore,
    Message,
    ORSClient,
    ORSServerError,
    ScoreGroupFailedError,
    TextBlock,
    ToolCallError,
)
from ors_grpc.protocol.errors import http_status_for
from ors_grpc.server import ServerConfig, create_server
from ors_grpc._runtime.service import environment_map
from tests.support import openreward_dialect_env as dialect
from tests.support.grpc_calls import call_tool, create_episode, error_reason, expect_error, serving
from tests.support.environments import EchoEnv
from tests.support.servers import ServeProcess, start_serve

pytestmark = pytest.mark.timeout(60)

ENV = "openrewardenv"
TASK = {"question": "What is 2+2?", "answer": "4"}
NOT_YET_S = 0.6  # how long a call that must wait is watched not starting
EVENT_TIMEOUT_S = 10.0

ENVIRONMENTS = [dialect.OpenRewardEnv, EchoEnv]
TOOLSETS = [dialect.GraderToolset]


def _as_openreward(source: str) -> types.ModuleType:
    """The dialect file with only its import line changed to openreward's."""
    ported = source.replace("from ors_grpc import", "from openreward.environments import")
    assert ported.count("openreward.environments") == 1 + source.count("openreward.environments")
    module = types.ModuleType("openreward_dialect_env_under_openreward")
    exec(compile(ported, module.__name__, "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def reference() -> types.ModuleType:
    return _as_openreward(Path(dialect.__file__).read_text())


@pytest.fixture(autouse=True)
def fresh_probes() -> Iterator[None]:
    dialect.reset()
    yield
    dialect.reset()


@contextlib.asynccontextmanager
async def client_and_stub(stream_episodes: bool = True, config: ServerConfig = ServerConfig()) -> AsyncIterator[Any]:
    server, port = await create_server(ENVIRONMENTS, "127.0.0.1:0", config=config, toolsets=TOOLSETS)
    try:
        async with AsyncORSClient(f"127.0.0.1:{port}", stream_episodes=stream_episodes) as client, \
                grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc

            yield client, pb_grpc.EnvironmentServiceStub(channel)
    finally:
        await server.stop(None)


async def wait_until(predicate: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), EVENT_TIMEOUT_S)


def entered(tag: str) -> Callable[[], bool]:
    return lambda: tag in dialect.ENTERED


async def still_not_entered(*tags: str) -> None:
    await asyncio.sleep(NOT_YET_S)
    assert not set(tags) & set(dialect.ENTERED), dialect.ENTERED


# ---------------------------------------------------------------------------
# Authoring: the same source behaves the same under both imports
# ---------------------------------------------------------------------------


def test_tool_listing_is_openreward_s(reference: types.ModuleType) -> None:
    ours = dialect.OpenRewardEnv.list_tools()
    assert ours.model_dump() == reference.OpenRewardEnv.list_tools().model_dump()
    assert ours.terminal_tool.model_dump() == {"name": "submit", "arg": "answer", "description": "Submit the final answer."}
    assert "submit" not in [t.name for t in ours.tools] and ours.supports_score_group


async def test_prompt_messages_and_refusals_are_openreward_s(reference: types.ModuleType) -> None:
    ours, theirs = dialect.OpenRewardEnv(TASK), reference.OpenRewardEnv(TASK)
    assert [b.model_dump() for b in await ours.get_prompt()] == [b.model_dump() for b in await theirs.get_prompt()]
    for name, tool_input in [("clash", {}), ("nope", {}), ("submit", {"wrong": 1})]:
        mine, their = (await ours._call_tool(name, tool_input)).model_dump(), (await theirs._call_tool(name, tool_input)).model_dump()
        if name == "submit":  # the one difference: the wrong fields one per line, after openreward's words
            assert their["error"].startswith("Tool input validation error: [{")
            mine, their = ({**answer, "error": None} for answer in (mine, their))
            assert (await ours._call_tool(name, tool_input)).model_dump()["error"] == (
                "Tool input validation error: answer: Field required")
        assert mine == their
        assert mine["reason"] in ("name_collision", "not_found", "input_validation")
    assert (await ours.call_terminal_tool("4")).model_dump() == (await theirs.call_terminal_tool("4")).model_dump()


class _One(BaseModel):
    text: str


class _Two(BaseModel):
    a: str
    b: str


def _env_with(namespace: Any, **tools: Any) -> type:
    """An environment class of `namespace`'s dialect with the given tool functions."""
    body = {
        "list_splits": classmethod(lambda cls: ["train"]),
        "list_tasks": classmethod(lambda cls, split: [{}]),
        "get_prompt": lambda self: [namespace.TextBlock(text="p")],
        **tools,
    }
    return type("Env", (namespace.Environment,), body)


def _tool_fn(model: type, namespace: Any) -> Any:
    """A new tool function taking `model`, returning the dialect's ToolOutput."""
    async def fn(self: Any, params: Any) -> Any:
        return namespace.ToolOutput(blocks=[])

    fn.__annotations__ = {"params": model, "return": namespace.ToolOutput}
    return fn


def _terminal_misuses(namespace: Any) -> dict[str, dict[str, Any]]:
    tool, terminal = namespace.tool, namespace.terminal
    return {
        "two terminal tools": {"a": terminal(tool(_tool_fn(_One, namespace))),
                               "b": terminal(tool(_tool_fn(_One, namespace)))},
        "a concurrent terminal tool": {"a": terminal(tool(concurrent=True)(_tool_fn(_One, namespace)))},
        "a terminal tool with two fields": {"a": terminal(tool(_tool_fn(_Two, namespace)))},
        "a terminal tool without @tool": {"a": terminal(_tool_fn(_One, namespace))},
    }


@pytest.mark.parametrize("misuse", ["two terminal tools", "a concurrent terminal tool",
                                    "a terminal tool with two fields", "a terminal tool without @tool"])
def test_terminal_tool_misuses_fail_when_listing_as_under_openreward(misuse: str) -> None:
    for namespace in (ors_grpc, openreward_environments):
        env_cls = _env_with(namespace, **_terminal_misuses(namespace)[misuse])
        with pytest.raises(ValueError):
            env_cls.list_tools()
    with pytest.raises(ValueError):
        environment_map([_env_with(ors_grpc, **_terminal_misuses(ors_grpc)[misuse])])


def test_an_environment_without_prompt_or_messages_is_refused_at_startup() -> None:
    env_cls = _env_with(ors_grpc, submit=dialect.OpenRewardEnv.submit)
    env_cls.get_prompt = ors_grpc.Environment.get_prompt
    with pytest.raises(ValueError, match="neither get_prompt"):
        environment_map([env_cls])


# ---------------------------------------------------------------------------
# The service's RPCs
# ---------------------------------------------------------------------------


async def test_tool_listings_carry_terminal_tool_score_group_and_block_types() -> None:
    async with serving(ENVIRONMENTS) as stub:
        listed = await stub.ListTools(pb.ListToolsRequest(env_name=ENV))
        sid = await create_episode(stub, ENV, task_spec=TASK)
        task_listed = await stub.ListTaskTools(pb.ListTaskToolsRequest(session_id=sid))
        plain = await stub.ListTools(pb.ListToolsRequest(env_name="echoenv"))
    for listing in (listed, task_listed):
        assert (listing.terminal_tool.name, listing.terminal_tool.arg) == ("submit", "answer")
        assert listing.supports_score_group
        assert list(listing.message_block_types) == ["text", "image", "reasoning", "tool_call", "tool_result"]
        assert "submit" not in [t.name for t in listing.tools]
    assert [t.name for t in task_listed.tools] == [t.name for t in listed.tools]  # shared=False: callable, unlisted
    assert not plain.HasField("terminal_tool") and not plain.supports_score_group


async def test_get_messages_answers_the_environment_s_or_the_prompt_as_one_user_message() -> None:
    async with client_and_stub() as (client, _):
        async with client.environment(ENV).session(TASK) as session:
            assert await session.get_messages() == dialect.OpenRewardEnv(TASK).get_messages()
        async with client.environment("echoenv").session(split="train", index=0) as session:
            prompt = await session.get_prompt()
            assert await session.get_messages() == [Message(role="user", blocks=prompt)]


@pytest.mark.parametrize("format", ["openai", "openrouter", "anthropic", "google"])
async def test_get_messages_formats_are_openreward_client_s(format: str) -> None:
    messages = dialect.OpenRewardEnv(TASK).get_messages()
    if format == "google":  # google has no reasoning: openreward's client raises, so must we
        messages = [m for m in messages if m.role != "assistant"]
        messages[-1] = Message(role="user", blocks=[TextBlock(text="Now answer.")])
    wire = [json.loads(m.model_dump_json()) for m in messages]
    theirs = convert_messages(
        [OpenRewardClientMessage(role=m["role"], blocks=_parse_blocks(m["blocks"]), detail=m.get("detail"))
         for m in wire],
        format=format,
    )
    from ors_grpc.client._message_formats import format_messages

    assert format_messages(messages, format) == theirs
    async with client_and_stub() as (client, _):
        async with client.environment(ENV).session(TASK) as session:
            if format == "google":
                with pytest.raises(ValueError, match="reasoning"):
                    await session.get_messages(format)
            else:
                assert await session.get_messages(format) == theirs


async def test_a_prompt_only_from_messages_is_them_flattened_as_openreward_does(reference: types.ModuleType) -> None:
    async with serving(ENVIRONMENTS) as stub:
        sid = await create_episode(stub, ENV, task_spec=TASK)
        prompt = await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
    expected = await reference.OpenRewardEnv(TASK).get_prompt()
    assert [b.text.text for b in prompt.blocks] == [b.text for b in expected]
    details = [json.loads(b.text.detail.json) if b.text.HasField("detail") else None for b in prompt.blocks]
    assert details == [b.detail for b in expected]


@pytest.mark.parametrize("stream_episodes", [True, False], ids=["run-episode-stream", "rpc-per-step"])
async def test_refusals_carry_their_reason(stream_episodes: bool) -> None:
    async with client_and_stub(stream_episodes) as (client, _):
        async with client.environment(ENV).session(TASK) as session:
            for name, tool_input, reason in [("nope", {}, "not_found"), ("clash", {}, "name_collision"),
                                             ("wait_step", {"wrong": 1}, "input_validation")]:
                with pytest.raises(ToolCallError) as caught:
                    await session.call_tool(name, tool_input)
                assert caught.value.reason == reason
            output = await session.call_terminal_tool("4")
            assert (output.reward, output.finished) == (1.0, True)
            with pytest.raises(ToolCallError) as caught:
                await session.call_tool("hint")
            assert caught.value.reason == "episode_finished"
            # An unknown tool is still not_found after the end, as openreward answers.
            with pytest.raises(ToolCallError) as caught:
                await session.call_tool("nope")
            assert caught.value.reason == "not_found"


async def test_the_refusal_reason_is_on_the_wire() -> None:
    async with serving(ENVIRONMENTS) as stub:
        sid = await create_episode(stub, ENV, task_spec=TASK)
        _, event = await call_tool(stub, sid, "nope")
    assert event.result.reason == types_pb2.RUN_TOOL_ERROR_REASON_NOT_FOUND
    assert event.result.error == "'nope' is not a valid tool"


# ---------------------------------------------------------------------------
# Who waits for whom
# ---------------------------------------------------------------------------


def _start(session: Any, name: str, tag: str) -> asyncio.Task:
    return asyncio.ensure_future(session.call_tool(name, {"tag": tag}))


async def test_concurrent_tools_run_together_and_plain_tools_take_turns() -> None:
    async with client_and_stub(stream_episodes=False) as (client, _):
        async with client.environment(ENV).session(TASK) as session:
            reads = [_start(session, "wait_read", tag) for tag in ("read-1", "read-2")]
            await wait_until(lambda: {"read-1", "read-2"} <= set(dialect.ENTERED))  # both inside at once
            steps = [_start(session, "wait_step", tag) for tag in ("step-1", "step-2")]
            await wait_until(lambda: "step-1" in dialect.ENTERED or "step-2" in dialect.ENTERED)
            first, second = ("step-1", "step-2") if "step-1" in dialect.ENTERED else ("step-2", "step-1")
            await still_not_entered(second)
            dialect.release(first)
            await wait_until(entered(second))
            for tag in ("read-1", "read-2", second):
                dialect.release(tag)
            outputs = await asyncio.gather(*reads, *steps)
            assert [o.blocks[0].text for o in outputs] == [
                "read read-1 done", "read read-2 done", "step step-1 done", "step step-2 done"]


@pytest.mark.parametrize("exclusive", ["wait_commit", "submit"])
async def test_an_exclusive_or_terminal_tool_waits_for_calls_in_flight_and_holds_later_ones(exclusive: str) -> None:
    async with client_and_stub(stream_episodes=False) as (client, _):
        async with client.environment(ENV).session(TASK) as session:
            in_flight = [_start(session, "wait_read", "early-read"), _start(session, "wait_step", "early-step")]
            await wait_until(lambda: {"early-read", "early-step"} <= set(dialect.ENTERED))
            if exclusive == "submit":
                writer = asyncio.ensure_future(session.call_terminal_tool("4"))
                writer_tag = "submit"
            else:
                writer = _start(session, "wait_commit", "commit")
                writer_tag = "commit"
            await still_not_entered(writer_tag)
            # Writer-preferring: a concurrent call arriving now waits behind the queued exclusive one.
            late = _start(session, "wait_read", "late-read")
            await still_not_entered(writer_tag, "late-read")
            dialect.release("early-read")
            await still_not_entered(writer_tag, "late-read")  # early-step is still inside
            dialect.release("early-step")
            await wait_until(entered(writer_tag))
            if exclusive == "wait_commit":
                await still_not_entered("late-read")
                dialect.release("commit")
                await wait_until(entered("late-read"))
                dialect.release("late-read")
                assert (await late).blocks[0].text == "read late-read done"
            else:
                # The terminal tool finished the episode: the held call is refused without running.
                with pytest.raises(ToolCallError) as caught:
                    await late
                assert caught.value.reason == "episode_finished" and "late-read" not in dialect.ENTERED
            assert (await writer).blocks[0].text in ("commit commit done", "correct")
            await asyncio.gather(*in_flight)


# ---------------------------------------------------------------------------
# Group scoring
# ---------------------------------------------------------------------------


def _candidate(answer: str, metadata: Any = None) -> GroupCandidate:
    return GroupCandidate(messages=[Message(role="assistant", blocks=[TextBlock(text=answer)])], metadata=metadata)


@pytest.mark.parametrize("stream_episodes", [True, False], ids=["run-episode-stream", "rpc-per-step"])
async def test_score_group_scores_each_candidate(stream_episodes: bool) -> None:
    async with client_and_stub(stream_episodes) as (client, _):
        async with client.environment(ENV).session(TASK) as session:
            assert await session.supports_score_group()
            bare = [Message(role="assistant", blocks=[TextBlock(text="5")])]
            scores = await session.score_group([_candidate("4"), bare, _candidate("4", {"id": 7})])
            # Bare floats become {reward}; metadata is echoed.
            assert scores == [GroupScore(reward=1.0), GroupScore(reward=0.0), GroupScore(reward=1.0, metadata={"id": 7})]
            with pytest.raises(ScoreGroupFailedError, match="judge unavailable"):
                await session.score_group([_candidate("4", {"fail": True})])
            with pytest.raises(ScoreGroupFailedError, match="returned 1 scores for 2 candidates"):
                await session.score_group([_candidate("4"), _candidate("4", {"drop": True})])
            # Scoring does not end the episode, nor does it need it running.
            assert (await session.call_tool("hint")).blocks[0].text == "starts with 4"


@pytest.mark.parametrize("stream_episodes", [True, False], ids=["run-episode-stream", "rpc-per-step"])
async def test_score_group_of_an_environment_without_it_is_unsupported(stream_episodes: bool) -> None:
    async with client_and_stub(stream_episodes) as (client, stub):
        async with client.environment("echoenv").session(split="train", index=0) as session:
            assert not await session.supports_score_group()
            with pytest.raises(ORSServerError) as caught:
                await session.score_group([_candidate("4")])
            assert caught.value.reason == "ERROR_REASON_SCORE_GROUP_UNSUPPORTED"
            assert caught.value.code == grpc.StatusCode.UNIMPLEMENTED
            assert caught.value.message == "Environment 'echoenv' does not implement score_group"
    assert http_status_for(grpc.StatusCode.UNIMPLEMENTED, "ERROR_REASON_SCORE_GROUP_UNSUPPORTED") == 404


async def test_a_scoring_runs_apart_from_its_stream_and_is_reattached_by_task_id() -> None:
    candidate = types_pb2.GroupCandidate(messages=[types_pb2.Message(
        role=types_pb2.MESSAGE_ROLE_ASSISTANT, blocks=[types_pb2.MessageBlock(text=types_pb2.TextBlock(text="4"))])])
    candidate.metadata.json = '{"wait": "scoring"}'
    async with serving(ENVIRONMENTS) as stub:
        sid = await create_episode(stub, ENV, task_spec=TASK)
        stream = stub.ScoreGroup(pb.ScoreGroupRequest(session_id=sid, candidates=[candidate]))
        first = await stream.read()
        assert first.WhichOneof("event") == "task_id"
        await wait_until(entered("scoring"))
        stream.cancel()  # the client goes away: the scoring goes on
        dialect.release("scoring")
        events = [e async for e in stub.ScoreGroup(pb.ScoreGroupRequest(session_id=sid, task_id=first.task_id))]
        assert [e.WhichOneof("event") for e in events] == ["task_id", "result"]
        assert events[0].task_id == first.task_id
        assert [(s.reward, json.loads(s.metadata.json)) for s in events[1].result.scores] == [(1.0, {"wait": "scoring"})]
        assert dialect.ENTERED.count("scoring") == 1
        # A tool call's task id is not a scoring's, nor the other way round.
        task_id, _ = await call_tool(stub, sid, "hint")
        error = await expect_error(stub.ScoreGroup(pb.ScoreGroupRequest(session_id=sid, task_id=task_id)))
        assert error_reason(error) == "ERROR_REASON_UNKNOWN_TASK_ID"
        error = await expect_error(stub.CallTool(pb.CallToolRequest(
            session_id=sid, call=types_pb2.ToolCall(name="hint", task_id=first.task_id))))
        assert error_reason(error) == "ERROR_REASON_UNKNOWN_TASK_ID"


async def test_invalid_candidates_are_invalid_argument() -> None:
    misplaced = types_pb2.GroupCandidate(messages=[types_pb2.Message(
        role=types_pb2.MESSAGE_ROLE_USER,
        blocks=[types_pb2.MessageBlock(reasoning=types_pb2.ReasoningBlock(text="r"))])])
    async with serving(ENVIRONMENTS) as stub:
        sid = await create_episode(stub, ENV, task_spec=TASK)
        error = await expect_error(stub.ScoreGroup(pb.ScoreGroupRequest(session_id=sid, candidates=[misplaced])))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "not valid in a 'user' message" in error.details()


async def test_run_episode_steps_for_messages_and_scoring() -> None:
    candidate = ors_grpc.protocol.convert.group_candidate_to_proto(_candidate("4", {"n": 1}))
    async with serving(ENVIRONMENTS) as stub:
        steps = [
            pb.RunEpisodeRequest(create=pb.CreateEpisodeRequest(env_name=ENV, task_spec=types_pb2.JsonValue(
                json=json.dumps(TASK)))),
            pb.RunEpisodeRequest(get_messages=pb.GetMessagesRequest()),
            pb.RunEpisodeRequest(score_group=pb.ScoreGroupStep(candidates=[candidate], task_id="s-1")),
            pb.RunEpisodeRequest(score_group=pb.ScoreGroupStep(candidates=[candidate], task_id="s-1")),
            pb.RunEpisodeRequest(delete=pb.DeleteEpisodeRequest()),
        ]
        answers = [answer async for answer in stub.RunEpisode(iter(steps))]
    assert [a.WhichOneof("step") for a in answers] == ["create", "get_messages", "score_group", "error", "delete"]
    assert len(answers[1].get_messages.messages) == 4
    assert [(s.reward, s.metadata.json) for s in answers[2].score_group.result.scores] == [(1.0, '{"n":1}')]
    assert "task_id is already in use" in answers[3].error.message


# ---------------------------------------------------------------------------
# Toolsets attached by name
# ---------------------------------------------------------------------------


async def test_a_registered_toolset_attaches_by_name() -> None:
    async with client_and_stub() as (client, _):
        env = client.environment(ENV)
        async with env.session(TASK, toolset="GraderToolset") as session:
            tools = [t.name for t in await session.list_tools()]
            assert {"toolset_echo", "wait_read", "lookup"} <= set(tools) and "grade" not in tools
            assert tools.count("wait_read") == 1
            assert (await session.terminal_tool()).model_dump() == {
                "name": "grade", "arg": None, "description": "Grade from the environment's state."}
            assert (await session.call_tool("toolset_echo", {"answer": "x"})).blocks[0].text == "toolset x"
            dialect.release("r")
            assert (await session.call_tool("wait_read", {"tag": "r"})).blocks[0].text == "toolset read r done"
            output = await session.call_terminal_tool("ignored: grade takes no input")
            assert (output.reward, output.finished) == (0.5, True)
        async with env.session(TASK) as session:  # other sessions keep the environment's own
            assert (await session.terminal_tool()).name == "submit"
        assert (await env.terminal_tool()).name == "submit"


async def test_an_unknown_toolset_name_is_invalid_argument_naming_the_valid_ones() -> None:
    async with serving(ENVIRONMENTS, toolsets=TOOLSETS) as stub:
        request = pb.CreateEpisodeRequest(session_id="s", env_name=ENV, toolset_name="Nope",
                                          task_spec=types_pb2.JsonValue(json=json.dumps(TASK)))
        error = await expect_error(stub.CreateEpisode(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(error) == "ERROR_REASON_UNKNOWN_TOOLSET"
    assert error.details() == "unknown toolset 'Nope'; valid options are ['GraderToolset']"


# ---------------------------------------------------------------------------
# A slow setup
# ---------------------------------------------------------------------------


class StartingEnv(EchoEnv):
    """EchoEnv whose setup waits until the test releases it."""

    async def setup(self) -> None:
        await dialect._release_event("setup").wait()


async def test_a_call_waiting_for_setup_gives_up_after_the_bound_and_may_retry() -> None:
    async with serving([StartingEnv], config=ServerConfig(setup_wait_s=0.5)) as stub:
        sid = await create_episode(stub, "startingenv")
        for rpc in (stub.GetPrompt(pb.GetPromptRequest(session_id=sid)),
                    stub.GetMessages(pb.GetMessagesRequest(session_id=sid)),
                    stub.CallTool(pb.CallToolRequest(session_id=sid, call=types_pb2.ToolCall(name="echo")))):
            error = await expect_error(rpc)
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert error.details() == "Environment still starting."
            assert error_reason(error) == "ERROR_REASON_ENVIRONMENT_STARTING"
            assert dict(error.trailing_metadata())["retry-after"] == "2"
        dialect.release("setup")
        prompt = await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
        assert prompt.blocks
    assert http_status_for(grpc.StatusCode.UNAVAILABLE, "ERROR_REASON_ENVIRONMENT_STARTING") == 503


# ---------------------------------------------------------------------------
# The blocking client against `ors-grpc serve --toolset`
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with start_serve("tests.support.openreward_dialect_env:OpenRewardEnv", "tests.support.environments:EchoEnv",
                     "--toolset", "tests.support.openreward_dialect_env:GraderToolset") as process:
        yield process


def test_the_blocking_client_runs_an_openreward_episode(serve: ServeProcess) -> None:
    with ORSClient(serve.grpc_target) as client:
        env = client.environment(ENV)
        assert env.terminal_tool().name == "submit" and env.supports_score_group()
        with env.session(split="train", index=1) as session:
            assert session.get_messages("anthropic")["system"] == "Answer briefly."
            assert session.score_group([_candidate("Paris"), _candidate("Rome")]) == [
                GroupScore(reward=1.0), GroupScore(reward=0.0)]
            assert session.is_assistant_message_final()
            assert session.call_terminal_tool("Paris").reward == 1.0
            with pytest.raises(ToolCallError) as caught:
                session.call_terminal_tool("Paris")
            assert caught.value.reason == "episode_finished"
        with env.session(split="train", index=0, toolset="GraderToolset") as session:
            assert session.terminal_tool().name == "grade"
            assert session.call_terminal_tool().reward == 0.5


@pytest.mark.parametrize("stream_episodes", [True, False], ids=["run-episode-stream", "rpc-per-step"])
async def test_the_client_rides_out_a_slow_setup(stream_episodes: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from ors_grpc.client import session as client_session

    monkeypatch.setattr(client_session, "_STARTING_RETRY_S", 0.1)
    server, port = await create_server([StartingEnv], "127.0.0.1:0", config=ServerConfig(setup_wait_s=0.3))
    try:
        async with AsyncORSClient(f"127.0.0.1:{port}", stream_episodes=stream_episodes) as client:
            async with client.environment("startingenv").session(split="train", index=0) as session:
                prompt = asyncio.ensure_future(session.get_prompt())
                echoed = asyncio.ensure_future(session.call_tool("echo", {"text": "hi"}))
                await asyncio.sleep(NOT_YET_S * 2)  # several bounded waits run out meanwhile
                assert not prompt.done() and not echoed.done()
                dialect.release("setup")
                assert (await prompt)[0].text
                assert (await echoed).blocks[0].text == "hi"
    finally:
        await server.stop(None)


async def test_deleting_an_episode_ends_calls_held_at_its_gate() -> None:
    async with serving(ENVIRONMENTS) as stub:
        sid = await create_episode(stub, ENV, task_spec=TASK)
        streams = [stub.CallTool(pb.CallToolRequest(session_id=sid, call=types_pb2.ToolCall(
            name=name, input=types_pb2.JsonValue(json=json.dumps({"tag": tag})))))
            for name, tag in [("wait_read", "held-read"), ("wait_commit", "queued-commit"), ("wait_read", "late")]]
        for stream in streams:
            assert (await stream.read()).WhichOneof("event") == "task_id"
        await wait_until(entered("held-read"))
        await asyncio.wait_for(stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid)), EVENT_TIMEOUT_S)
        for stream in streams:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stream.read()
            assert error_reason(caught.value) == "ERROR_REASON_SESSION_DELETED"
        assert dialect.ENTERED == ["held-read"]
        # The server goes on serving.
        sid = await create_episode(stub, ENV, task_spec=TASK)
        dialect.release("after")
        _, event = await call_tool(stub, sid, "wait_commit", {"tag": "after"})
        assert event.result.output.blocks[0].text.text == "commit after done"
