"""1,000 concurrent episodes through each door of one `ors-grpc serve`: every
result correct, no errors, and no session left behind.

Each test runs in phases so that all episodes are open at once: create them
all (the server then holds exactly 1,000 sessions), play them all
concurrently, delete them all (the server then holds none). Marked slow:
`.ci/run` runs them in a step of their own (`pytest -m slow`).
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from tests.support.reliability_helpers import (
    grpc_call,
    grpc_episode,
    grpc_stub,
    http_call,
    http_episode,
    open_sessions,
    serve_probe,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EPISODES = 1_000
#: Open HTTP connections at most: bounds the client's and the server's file descriptors.
HTTP_CONNECTIONS = 100


def _answer(number: int) -> str:
    # ProbeEnv episodes are created with answer "yes": half answer right.
    return "yes" if number % 2 == 0 else "no"


def _reward(number: int) -> float:
    return 1.0 if number % 2 == 0 else 0.0


async def _play_http(http: aiohttp.ClientSession, sid: str, number: int) -> None:
    headers = {"X-Session-ID": sid}
    async with http.get("/probeenv/prompt", headers=headers) as response:
        assert (await response.json())[0]["text"] == f"prompt load-{number}"
    tag = (await http_call(http, sid, "echo_tag")).result()
    assert tag["output"]["blocks"][0]["text"] == f"load-{number}"
    graded = (await http_call(http, sid, "submit", {"answer": _answer(number)})).result()["output"]
    assert (graded["reward"], graded["finished"]) == (_reward(number), True)


async def _delete_http(http: aiohttp.ClientSession, sid: str) -> None:
    for path in ("/delete", "/delete_session"):
        async with http.post(path, headers={"X-Session-ID": sid}) as response:
            assert (response.status, await response.json()) == (200, {"sid": sid})


async def test_1000_concurrent_episodes_through_the_http_bridge() -> None:
    with serve_probe() as serve:
        connector = aiohttp.TCPConnector(limit=HTTP_CONNECTIONS)
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(base_url=serve.http_url, connector=connector, timeout=timeout) as http, \
                grpc_stub(serve.grpc_target) as stub:
            sids = await asyncio.gather(*(http_episode(http, f"load-{number}") for number in range(EPISODES)))
            assert len(set(sids)) == EPISODES
            assert await open_sessions(stub) == EPISODES
            await asyncio.gather(*(_play_http(http, sid, number) for number, sid in enumerate(sids)))
            await asyncio.gather(*(_delete_http(http, sid) for sid in sids))
            assert await open_sessions(stub) == 0


async def _play_grpc(stub, sid: str, number: int) -> None:
    prompt = await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
    assert prompt.blocks[0].text.text == f"prompt load-{number}"
    events = await grpc_call(stub, sid, "echo_tag")
    assert events[-1].result.output.blocks[0].text.text == f"load-{number}"
    graded = (await grpc_call(stub, sid, "submit", {"answer": _answer(number)}))[-1].result.output
    assert (graded.reward, graded.finished) == (_reward(number), True)


async def _delete_grpc(stub, sid: str) -> None:
    assert (await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))).session_id == sid
    assert (await stub.DeleteSessionId(pb.DeleteSessionIdRequest(session_id=sid))).session_id == sid


async def test_1000_concurrent_episodes_through_grpc() -> None:
    with serve_probe() as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            sids = await asyncio.gather(*(grpc_episode(stub, f"load-{number}") for number in range(EPISODES)))
            assert len(set(sids)) == EPISODES
            assert await open_sessions(stub) == EPISODES
            await asyncio.gather(*(_play_grpc(stub, sid, number) for number, sid in enumerate(sids)))
            await asyncio.gather(*(_delete_grpc(stub, sid) for sid in sids))
            assert await open_sessions(stub) == 0
