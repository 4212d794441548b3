"""Bursts, scale and memory, all slow (`pytest -m slow`):

- 3,000 RunEpisode streams opened at once are all answered (grpc core's
  default pending-call limits cancelled 500 to 600 of them);
- 5,000 concurrent episodes on each door, HTTP (`serve --http-port`) and
  gRPC (the Python client): a closed loop of 20 s, and 5,000 held open at
  once; no failure, and no session left;
- malformed 33 MB messages are freed at once: 80 of them leave the server
  under 600 MB RSS.

The test process raises its soft file-descriptor limit to the hard limit
(`resource.setrlimit`); the servers it starts inherit it. 5,000 gRPC
episodes share one channel; 5,000 HTTP episodes share at most
HTTP_CONNECTIONS connections.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp
import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.client import AsyncORSClient
from tests.support.reliability_helpers import grpc_stub, http_call, http_episode, open_sessions, serve_probe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EPISODES = 5_000
STREAMS = 3_000
CLOSED_LOOP_S = 20.0
HTTP_CONNECTIONS = 1_000
#: Generous: 5,000 episodes on a busy two-core machine take a while.
CLIENT_TIMEOUT_S = 600.0


@pytest.fixture(autouse=True, scope="module")
def many_file_descriptors() -> None:
    """Up to the hard limit: thousands of sockets on each side of loopback."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65_536
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _figure(name: str, **values: Any) -> None:
    """The figures docs/reliability.md quotes (shown with `pytest -s`)."""
    print(f"\n[figure] {name}: " + ", ".join(f"{key}={value}" for key, value in values.items()))


# ----------------------------------------------------------------------------
# A burst of new streams
# ----------------------------------------------------------------------------


async def _one_stream_episode(stub: pb_grpc.EnvironmentServiceStub, number: int) -> None:
    call = stub.RunEpisode()
    create = pb.CreateEpisodeRequest(env_name="probeenv")
    create.task_spec.json = json.dumps({"tag": f"burst-{number}", "answer": "yes"})
    await call.write(pb.RunEpisodeRequest(create=create))
    created = await call.read()
    assert created.WhichOneof("step") == "create", created
    await call.write(pb.RunEpisodeRequest(delete=pb.DeleteEpisodeRequest()))
    assert (await call.read()).WhichOneof("step") == "delete"
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF


async def test_3000_run_episode_streams_opened_at_once_are_all_answered() -> None:
    with serve_probe() as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            started = time.monotonic()
            outcomes = await asyncio.gather(*(_one_stream_episode(stub, n) for n in range(STREAMS)),
                                            return_exceptions=True)
            failures = [repr(outcome)[:200] for outcome in outcomes if outcome is not None]
            _figure("burst", streams=STREAMS, failures=len(failures), seconds=round(time.monotonic() - started, 1))
            assert failures == [], (len(failures), failures[:5])
            assert await open_sessions(stub) == 0


# ----------------------------------------------------------------------------
# 5,000 concurrent episodes per door
# ----------------------------------------------------------------------------


async def _grpc_client_episode(client: AsyncORSClient, number: int) -> None:
    async with client.environment("probeenv").session({"tag": f"e-{number}", "answer": "yes"}) as session:
        prompt = await session.get_prompt()
        assert prompt[0].text == f"prompt e-{number}"
        output = await session.call_tool("echo_tag", {})
        assert output.blocks[0].text == f"e-{number}"
        graded = await session.call_tool("submit", {"answer": "yes"})
        assert (graded.reward, graded.finished) == (1.0, True)


async def _http_episode(http: aiohttp.ClientSession, number: int) -> None:
    sid = await http_episode(http, f"e-{number}")
    async with http.get("/probeenv/prompt", headers={"X-Session-ID": sid}) as response:
        assert (await response.json())[0]["text"] == f"prompt e-{number}"
    assert (await http_call(http, sid, "echo_tag")).result()["output"]["blocks"][0]["text"] == f"e-{number}"
    graded = (await http_call(http, sid, "submit", {"answer": "yes"})).result()["output"]
    assert (graded["reward"], graded["finished"]) == (1.0, True)
    for path in ("/delete", "/delete_session"):
        async with http.post(path, headers={"X-Session-ID": sid}) as response:
            assert response.status == 200, await response.text()


async def _closed_loop(episode: Callable[[int], Awaitable[None]]) -> tuple[int, list[str]]:
    """EPISODES workers, each running episodes one after another for CLOSED_LOOP_S."""
    deadline = time.monotonic() + CLOSED_LOOP_S
    done = 0
    failures: list[str] = []

    async def worker(number: int) -> None:
        nonlocal done
        while time.monotonic() < deadline:
            try:
                await episode(number)
                done += 1
            except Exception as exc:  # counted, and shown, below
                failures.append(repr(exc)[:200])

    await asyncio.gather(*(worker(number) for number in range(EPISODES)))
    return done, failures


class AllOpen:
    """Every episode waits, open, until all are open and the server's count
    of sessions has been read."""

    def __init__(self, stub: pb_grpc.EnvironmentServiceStub) -> None:
        self._stub = stub
        self._barrier = asyncio.Barrier(EPISODES)
        self._counted = asyncio.Event()
        self.open_at_once: int | None = None

    async def wait(self, number: int) -> None:
        await self._barrier.wait()
        if number == 0:
            self.open_at_once = await open_sessions(self._stub)
            self._counted.set()
        await self._counted.wait()


async def _held_open(stub: pb_grpc.EnvironmentServiceStub,
                     episode_open: Callable[[int, AllOpen], Awaitable[None]]) -> tuple[int | None, list[str]]:
    """EPISODES episodes that all wait, open, until every one is open; the
    sessions the server held then, and the failures."""
    all_open = AllOpen(stub)
    outcomes = await asyncio.gather(*(episode_open(number, all_open) for number in range(EPISODES)),
                                    return_exceptions=True)
    return all_open.open_at_once, [repr(outcome)[:200] for outcome in outcomes if outcome is not None]


def _client(target: str) -> AsyncORSClient:
    return AsyncORSClient(target)


async def test_5000_concurrent_episodes_through_grpc_closed_loop_and_held_open() -> None:
    with serve_probe() as serve:
        async with _client(serve.grpc_target) as client, grpc_stub(serve.grpc_target) as stub:
            started = time.monotonic()
            done, failures = await _closed_loop(lambda number: _grpc_client_episode(client, number))
            _figure("grpc closed loop", workers=EPISODES, episodes=done, failures=len(failures),
                    seconds=round(time.monotonic() - started, 1))
            assert failures == [] and done >= EPISODES, (done, len(failures), failures[:5])
            assert await open_sessions(stub) == 0

            async def held(number: int, all_open: AllOpen) -> None:
                async with client.environment("probeenv").session({"tag": f"h-{number}"}) as session:
                    await all_open.wait(number)
                    assert (await session.call_tool("echo_tag", {})).blocks[0].text == f"h-{number}"

            started = time.monotonic()
            open_at_once, failures = await _held_open(stub, held)
            _figure("grpc held open", episodes=EPISODES, open_at_once=open_at_once, failures=len(failures),
                    seconds=round(time.monotonic() - started, 1))
            assert failures == [] and open_at_once == EPISODES, (open_at_once, len(failures), failures[:5])
            assert await open_sessions(stub) == 0


async def test_5000_concurrent_episodes_through_http_closed_loop_and_held_open() -> None:
    with serve_probe() as serve:
        connector = aiohttp.TCPConnector(limit=HTTP_CONNECTIONS)
        timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
        async with aiohttp.ClientSession(base_url=serve.http_url, connector=connector, timeout=timeout) as http, \
                grpc_stub(serve.grpc_target) as stub:
            started = time.monotonic()
            done, failures = await _closed_loop(lambda number: _http_episode(http, number))
            _figure("http closed loop", workers=EPISODES, episodes=done, failures=len(failures),
                    seconds=round(time.monotonic() - started, 1))
            assert failures == [] and done >= EPISODES, (done, len(failures), failures[:5])
            assert await open_sessions(stub) == 0

            async def held(number: int, all_open: AllOpen) -> None:
                sid = await http_episode(http, f"h-{number}")
                try:
                    await all_open.wait(number)
                    tag = (await http_call(http, sid, "echo_tag")).result()["output"]["blocks"][0]["text"]
                    assert tag == f"h-{number}"
                finally:
                    async with http.post("/delete", headers={"X-Session-ID": sid}) as response:
                        assert response.status == 200, await response.text()

            started = time.monotonic()
            open_at_once, failures = await _held_open(stub, held)
            _figure("http held open", episodes=EPISODES, open_at_once=open_at_once, failures=len(failures),
                    seconds=round(time.monotonic() - started, 1))
            assert failures == [] and open_at_once == EPISODES, (open_at_once, len(failures), failures[:5])
            assert await open_sessions(stub) == 0


# ----------------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------------

MALFORMED_BYTES = 33_000_000
ROUNDS, AT_ONCE = 20, 4
RSS_LIMIT_BYTES = 600 * 1024 * 1024


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_malformed_33_mb_messages_are_freed_at_once() -> None:
    garbage = b"\xff" * MALFORMED_BYTES
    with serve_probe() as serve:
        before = _rss_bytes(serve.proc.pid)
        options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
        async with grpc.aio.insecure_channel(serve.grpc_target, options=options) as channel:
            get_prompt = channel.unary_unary("/ors.v1.EnvironmentService/GetPrompt")
            peak = 0
            for _ in range(ROUNDS):
                calls = [get_prompt(garbage, timeout=60) for _ in range(AT_ONCE)]
                for outcome in await asyncio.gather(*calls, return_exceptions=True):
                    assert isinstance(outcome, grpc.aio.AioRpcError), outcome
                    assert outcome.code() == grpc.StatusCode.INVALID_ARGUMENT, outcome
                peak = max(peak, _rss_bytes(serve.proc.pid))
        after = _rss_bytes(serve.proc.pid)
        _figure("malformed messages", messages=ROUNDS * AT_ONCE, rss_before_mb=before >> 20,
                rss_peak_mb=peak >> 20, rss_after_mb=after >> 20)
        assert after < RSS_LIMIT_BYTES and peak < RSS_LIMIT_BYTES, (before, peak, after)
