"""The unmodified `ors-sdk` and `openreward` clients, against `ors-grpc serve --http-port`."""

from __future__ import annotations

import asyncio
from typing import Iterator

import pytest
from openreward.api.environments.client import AsyncEnvironmentsAPI
from ors.client import ORS, AsyncORS

from tests.support.environments import TEST_TASKS, TRAIN_TASKS
from tests.support.servers import ServeProcess, start_serve


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with start_serve("tests.support.environments:EchoEnv", "tests.support.environments:SlowSetupEnv", "--http-port", "0") as process:
        yield process


def text_of(output) -> str:
    return output.blocks[0].text


# ----------------------------------------------------------------------------
# ors-sdk: ors.client
# ----------------------------------------------------------------------------


def test_ors_sync_client_discovery_and_episode(serve: ServeProcess) -> None:
    with ORS(base_url=serve.http_url) as client:
        env = client.environment("echoenv")
        assert env.list_splits() == ["train", "test"]
        tasks = env.list_tasks("train")
        assert [task.task_spec for task in tasks] == TRAIN_TASKS
        assert env.num_tasks("test") == len(TEST_TASKS)
        assert env.get_task("test", 1).task_spec == TEST_TASKS[1]
        assert [task.task_spec for task in env.get_task_range("train", 1, None)] == TRAIN_TASKS[1:]
        openai_tools = env.list_tools(format="openai")
        echo = next(tool for tool in openai_tools if tool["name"] == "echo")
        assert echo["type"] == "function" and echo["parameters"]["required"] == ["text"]

        with env.session(task=tasks[0], secrets={"TOKEN": "s3cret"}) as session:
            assert text_of_prompt(session.get_prompt()) == "Say hello"
            names = [tool["name"] for tool in session.list_tools(format="openai")]
            assert names[-1] == "hint"
            assert text_of(session.call_tool("echo", {"text": "hi"})) == "hi"
            assert text_of(session.call_tool("secret")) == "secret:['TOKEN']"
            result = session.call_tool("submit", {"answer": "hello"})
            assert (result.reward, result.finished) == (1.0, True)


def text_of_prompt(blocks) -> str:
    return blocks[0].text


async def test_ors_async_client_session_from_split_and_index(serve: ServeProcess) -> None:
    client = AsyncORS(base_url=serve.http_url)  # keep it alive: its finalizer closes the HTTP client
    env = client.environment("EchoEnv")
    try:
        async with env.session(split="train", index=2) as session:
            assert text_of_prompt(await session.get_prompt()) == "Say 42"
            added = await session.call_tool("add", {"a": 40, "b": 2})
            assert (text_of(added), added.reward, added.finished) == ("42", 0.0, False)
            meta = await session.call_tool("metadata")
            assert meta.metadata["big"] == 2**70 and isinstance(meta.metadata["float"], float)
            big = await session.call_tool("big", {"chars": 50_000})
            assert text_of(big) == "x" * 50_000
            with pytest.raises(RuntimeError, match="boom"):
                await session.call_tool("fail")
    finally:
        await env.client.close()


async def test_ors_async_client_runs_50_concurrent_episodes(serve: ServeProcess) -> None:
    client = AsyncORS(base_url=serve.http_url)
    env = client.environment("echoenv")

    async def episode(index: int) -> float:
        async with env.session(split="test", index=index % 2) as session:
            await session.get_prompt()
            result = await session.call_tool("submit", {"answer": TEST_TASKS[index % 2]["answer"]})
            return result.reward

    try:
        assert await asyncio.gather(*(episode(i) for i in range(50))) == [1.0] * 50
    finally:
        await env.client.close()


# ----------------------------------------------------------------------------
# openreward: AsyncEnvironmentsAPI (stricter, uses bare paths without a variant)
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("variant", [None, "echoenv"])
async def test_openreward_client(serve: ServeProcess, variant: str | None) -> None:
    api = AsyncEnvironmentsAPI(base_url=serve.http_url, api_key="")
    try:
        env = api.get("echoenv", variant=variant)
        assert await env.list_splits() == ["train", "test"]
        tasks = await env.list_tasks("train")
        assert [task.task_spec for task in tasks] == TRAIN_TASKS
        assert (await env.get_task("test", 0)).task_spec == TEST_TASKS[0]
        assert await env.num_tasks("train") == len(TRAIN_TASKS)
        tools = await env.list_tools(format="openai")
        assert {"echo", "submit", "secret"} <= {tool["name"] for tool in tools}

        async with env.session(task=tasks[1], secrets={"OPENAI_API_KEY": "sk-test"}) as session:
            prompt = await session.get_prompt()
            assert prompt[0].text == "Say world" and prompt[0].detail is None
            assert {tool.name for tool in await session.list_tools()} >= {"echo", "submit"}
            # The client adds its own api_key entries; only names come back.
            secret_names = text_of(await session.call_tool("secret"))
            assert "'OPENAI_API_KEY'" in secret_names and "sk-test" not in secret_names
            result = await session.call_tool("submit", {"answer": "world"})
            assert (result.reward, result.finished) == (1.0, True)

        async with env.session(split="train", index=0) as session:
            image = await session.call_tool("image", {"size": 1024})
            assert (image.blocks[0].mimeType, image.blocks[0].detail) == ("image/png", {"size": 1024})
    finally:
        await api.aclose()
