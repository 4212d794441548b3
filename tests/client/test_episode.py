"""The Python gRPC client (sync and async) against `ors-grpc serve`: full episodes, errors, cleanup."""

from __future__ import annotations

import asyncio
import base64
from typing import Iterator

import pytest
from ors.client import convert_tool_response

from ors_grpc.client import (
    AsyncORSClient,
    ImageBlock,
    ORSClient,
    ORSServerError,
    Split,
    Task,
    TextBlock,
    ToolCallError,
    ToolFailedError,
)
from tests.support.environments import TEST_TASKS, TRAIN_TASKS
from tests.support.servers import ServeProcess, start_serve

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with start_serve("tests.support.environments:EchoEnv") as process:
        yield process


@pytest.fixture
def client(serve: ServeProcess) -> Iterator[ORSClient]:
    with ORSClient(serve.grpc_target) as client:
        yield client


@pytest.fixture(params=[True, False], ids=["run-episode-stream", "rpc-per-step"])
async def aclient(serve: ServeProcess, request: pytest.FixtureRequest):
    async with AsyncORSClient(serve.grpc_target, stream_episodes=request.param) as client:
        yield client


def image_bytes(size: int) -> bytes:
    """What EchoEnv's `image` tool draws."""
    return bytes(i % 256 for i in range(size))


def test_discovery(client: ORSClient) -> None:
    env = client.environment("echoenv")
    assert client.list_environments() == ["echoenv"]
    assert env.list_splits() == [Split(name="train", type="train"), Split(name="test", type="test")]
    assert env.list_tasks("test") == [Task("echoenv", spec) for spec in TEST_TASKS]
    assert env.num_tasks("train") == len(TRAIN_TASKS)
    # Lossless JSON: 2**70 stays an int, 1.0 stays a float.
    first = env.get_task("train", 0).task_spec
    assert first == TRAIN_TASKS[0] and isinstance(first["ratio"], float)
    assert [t.task_spec for t in env.get_task_range("train", -2)] == TRAIN_TASKS[-2:]
    assert [t.task_spec for t in env.get_task_range("train", stop=1)] == TRAIN_TASKS[:1]
    assert "echo" in [spec.name for spec in env.list_tools()]


@pytest.mark.parametrize("provider", ["openai", "anthropic", "google", "openrouter"])
def test_tool_formats_match_the_reference_client(client: ORSClient, provider: str) -> None:
    env = client.environment("echoenv")
    specs = env.list_tools()
    reference = convert_tool_response({"tools": [spec.model_dump() for spec in specs]}, format=provider)
    assert env.list_tools(format=provider) == reference


def test_sync_full_episode(client: ORSClient) -> None:
    open_before = client.health().open_sessions
    env = client.environment("echoenv")
    with env.session(split="train", index=0) as session:
        assert client.health().open_sessions == open_before + 1
        assert session.get_prompt() == [TextBlock(text="Say hello")]
        tools = session.list_tools()
        assert tools[-1].name == "hint" and tools[-1].input_schema is None

        added = session.call_tool("add", {"a": 2, "b": 3})
        assert added.blocks == [TextBlock(text="5")] and added.reward == 0.0 and not added.finished
        assert session.call_tool("echo", {"text": "hi"}).reward is None

        with pytest.raises(ToolCallError) as refused:
            session.call_tool("no_such_tool", {})
        assert refused.value.tool_name == "no_such_tool" and "no_such_tool" in refused.value.message
        with pytest.raises(ToolFailedError, match="boom"):
            session.call_tool("fail")

        (image,) = session.call_tool("image", {"size": 1000}).blocks
        assert isinstance(image, ImageBlock)
        assert image.mimeType == "image/png" and image.detail == {"size": 1000}
        assert base64.b64decode(image.data) == image_bytes(1000)

        submitted = session.call_tool("submit", {"answer": "hello"})
        assert submitted.reward == 1.0 and submitted.finished
        with pytest.raises(ToolCallError):
            session.call_tool("echo", {"text": "after the end"})
    assert client.health().open_sessions == open_before


async def test_async_full_episode_from_a_task_with_secrets(aclient: AsyncORSClient) -> None:
    env = aclient.environment("echoenv")
    task = await env.get_task("train", 2)
    async with env.session(task, secrets={"TOKEN": "s3cr3t", "API": "x"}) as session:
        assert await session.get_prompt() == [TextBlock(text="Say 42")]
        assert "hint" not in [spec.name for spec in await session.list_tools()]
        secret = await session.call_tool("secret")
        assert secret.blocks == [TextBlock(text="secret:['API', 'TOKEN']")]

        meta = await session.call_tool("metadata")
        assert meta.metadata == {"big": 2**70, "float": 1.0, "unicode": "ünïcödé ✓", "nested": {"z": [1, 2.0], "a": None}}
        assert list(meta.blocks[0].detail) == ["b", "a"]

        with pytest.raises(ToolCallError):
            await session.call_tool("add", {"a": "not a number", "b": 1})
        (image,) = (await session.call_tool("image", {"size": 3})).blocks
        assert base64.b64decode(image.data) == image_bytes(3)
        assert (await session.call_tool("submit", {"answer": "42"})).reward == 1.0


def test_sync_session_is_deleted_when_the_body_raises(client: ORSClient) -> None:
    open_before = client.health().open_sessions
    with pytest.raises(KeyError, match="from the body"):
        with client.environment("echoenv").session(split="test", index=1) as session:
            session.call_tool("echo", {"text": "x"})
            raise KeyError("from the body")
    assert client.health().open_sessions == open_before


async def test_async_session_is_deleted_when_the_body_raises(aclient: AsyncORSClient) -> None:
    open_before = (await aclient.health()).open_sessions
    with pytest.raises(ValueError, match="from the body"):
        async with aclient.environment("echoenv").session(split="train", index=1) as session:
            assert (await aclient.health()).open_sessions == open_before + 1
            raise ValueError("from the body")
    assert (await aclient.health()).open_sessions == open_before
    with pytest.raises(RuntimeError, match="not open"):
        await session.get_prompt()


@pytest.mark.parametrize("stream_episodes", [True, False], ids=["run-episode-stream", "rpc-per-step"])
async def test_closing_the_client_ends_the_episodes_still_open(serve: ServeProcess, stream_episodes: bool) -> None:
    async with AsyncORSClient(serve.grpc_target) as watcher:
        open_before = (await watcher.health()).open_sessions
        closing = AsyncORSClient(serve.grpc_target, stream_episodes=stream_episodes)
        env = closing.environment("echoenv")
        for index in (0, 1):
            await env.session(split="train", index=index).__aenter__()  # never exited
        assert (await watcher.health()).open_sessions == open_before + 2
        await closing.close()
        assert (await watcher.health()).open_sessions == open_before


def test_closing_the_sync_client_ends_the_episodes_still_open(serve: ServeProcess, client: ORSClient) -> None:
    open_before = client.health().open_sessions
    closing = ORSClient(serve.grpc_target)
    closing.environment("echoenv").session(split="test", index=0).__enter__()  # never exited
    assert client.health().open_sessions == open_before + 1
    closing.close()
    assert client.health().open_sessions == open_before


def test_server_errors_carry_reason_and_message(client: ORSClient) -> None:
    with pytest.raises(ORSServerError) as unknown_env:
        client.environment("nowhere").list_splits()
    assert unknown_env.value.reason == "ERROR_REASON_UNKNOWN_ENVIRONMENT"
    assert unknown_env.value.code.name == "NOT_FOUND"

    env = client.environment("echoenv")
    with pytest.raises(ORSServerError) as bad_split:
        env.num_tasks("nope")
    assert bad_split.value.reason == "ERROR_REASON_INVALID_SPLIT"
    with pytest.raises(ORSServerError) as bad_index:
        with env.session(split="train", index=99):
            pass
    assert bad_index.value.reason == "ERROR_REASON_INVALID_INDEX"
    assert bad_index.value.code.name == "INVALID_ARGUMENT"
    assert client.health().open_sessions == 0


async def test_concurrent_calls_in_one_session_all_get_their_own_results(aclient: AsyncORSClient) -> None:
    # With the episode stream, one call takes the stream and the others go by CallTool.
    async with aclient.environment("echoenv").session(split="train", index=0) as session:
        outputs = await asyncio.gather(
            session.call_tool("sleep", {"seconds": 0.2}),
            *(session.call_tool("echo", {"text": str(n)}) for n in range(5)),
            session.get_prompt(),
        )
        assert [o.blocks[0].text for o in outputs[:6]] == ["slept", "0", "1", "2", "3", "4"]
        assert outputs[6] == [TextBlock(text="Say hello")]
        assert (await session.call_tool("echo", {"text": "after"})).blocks == [TextBlock(text="after")]
    assert (await aclient.health()).open_sessions == 0


def test_session_arguments_are_checked(client: ORSClient) -> None:
    env = client.environment("echoenv")
    for bad in ({}, {"split": "train"}, {"task": {"id": 0}, "split": "train", "index": 0}):
        with pytest.raises(ValueError):
            env.session(**bad)


async def test_async_episode_record_during_the_episode_after_it_and_by_session_id(aclient: AsyncORSClient) -> None:
    env = aclient.environment("echoenv")
    async with env.session(await env.get_task("train", 2), secrets={"TOKEN": "s3cr3t"}) as session:
        await session.call_tool("echo", {"text": "my s3cr3t"})
        live = await session.episode_record()
        assert (await session.call_tool("submit", {"answer": "42"})).reward == 1.0
    ended = await session.episode_record()
    by_id = await aclient.episode_record(ended.session_id)

    assert live.ended is None and [call.tool_name for call in live.calls] == ["echo"]
    assert live.calls[0].input == {"text": "my ***"} and live.calls[0].reward is None
    assert ended == by_id and ended.ended == "deleted" and ended.task == TRAIN_TASKS[2]
    assert [(call.tool_name, call.reward, call.finished) for call in ended.calls] == [
        ("echo", None, False), ("submit", 1.0, True)]
    assert ended.totals.calls == 2 and ended.totals.finished and ended.totals.last_reward == 1.0


def test_sync_episode_record(client: ORSClient) -> None:
    env = client.environment("echoenv")
    with env.session(env.get_task("train", 0)) as session:
        session.call_tool("add", {"a": 1, "b": 2})
        record = session.episode_record()
    assert record.calls[0].tool_name == "add" and record.calls[0].input == {"a": 1, "b": 2}
    assert client.episode_record(record.session_id).ended == "deleted"


@pytest.fixture(scope="module")
def crashing() -> Iterator[ServeProcess]:
    """CrashReportEnv: its `crash_in_flight` tool answers as a call whose worker process died under it."""
    with start_serve("tests.support.crash_report_env:CrashReportEnv") as process:
        yield process


def _assert_crashed(error: ORSServerError) -> None:
    assert error.reason == "ERROR_REASON_ENVIRONMENT_CRASHED" and error.code.name == "ABORTED"
    assert "killed by SIGSEGV" in error.message


def test_the_call_its_process_died_under_raises_environment_crashed_not_a_tool_failure(crashing: ServeProcess) -> None:
    with ORSClient(crashing.grpc_target) as client:
        with client.environment("crashreportenv").session({"id": 0}) as session:
            with pytest.raises(ORSServerError) as caught:
                session.call_tool("crash_in_flight")
    _assert_crashed(caught.value)


@pytest.mark.parametrize("stream_episodes", [True, False], ids=["run-episode-stream", "rpc-per-step"])
async def test_the_async_client_raises_environment_crashed_for_the_call_in_flight(
        crashing: ServeProcess, stream_episodes: bool) -> None:
    async with AsyncORSClient(crashing.grpc_target, stream_episodes=stream_episodes) as client:
        async with client.environment("crashreportenv").session({"id": 0}) as session:
            for tool in ("crash_in_flight", "crash_in_flight_later"):
                with pytest.raises(ORSServerError) as caught:
                    await session.call_tool(tool)
                _assert_crashed(caught.value)
