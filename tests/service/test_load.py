"""Many episodes at once over one server: no cross-talk, nothing left behind."""

from __future__ import annotations

import asyncio

import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from tests.support.grpc_calls import call_tool, create_episode, serving
from tests.support.environments import EchoEnv


async def run_episode(stub, number: int, calls: int) -> None:
    sid = await create_episode(stub, index=number % 3)
    await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
    for call in range(calls):
        text = f"session {number} call {call}"
        _, event = await call_tool(stub, sid, "echo", {"text": text})
        assert event.result.output.blocks[0].text.text == text
        _, event = await call_tool(stub, sid, "add", {"a": number, "b": call})
        assert event.result.output.blocks[0].text.text == str(number + call)
    _, event = await call_tool(stub, sid, "submit", {"answer": "nope"})
    assert event.result.output.finished
    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))


async def run_many(sessions: int, calls: int) -> None:
    async with serving([EchoEnv]) as stub:
        await asyncio.gather(*(run_episode(stub, n, calls) for n in range(sessions)))
        assert (await stub.Health(pb.HealthRequest())).open_sessions == 0


async def test_concurrent_episodes() -> None:
    await run_many(sessions=30, calls=3)


@pytest.mark.slow
async def test_many_concurrent_episodes() -> None:
    await run_many(sessions=500, calls=10)
