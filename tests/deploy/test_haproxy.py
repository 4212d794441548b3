"""HAProxy in front of `ors-grpc serve` backends (deploy/haproxy/haproxy.cfg.template):
consistent hash on `x-session-id` plus a stick table on it.

Affinity is read from the results (each tool output carries the pid of the
backend that ran it, tests/support/scaleout_env.py) for our Python client by
RPC per step and on RunEpisode streams, and for the unmodified `ors.client`
through an `ors-grpc bridge` in front. A rolling restart's step: the backend
set to DRAIN in HAProxy (runtime API) and sent SIGTERM serves its open
episode to the end through its stick entry, receives no creation at all
(unlike nginx, where creations hashing onto it are refused and made again),
and exits once the episode ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Iterator

import pytest
from ors.client import AsyncORS

from deploy.haproxy.run_topology import Topology, find_haproxy
from ors_grpc.client import AsyncORSClient, ORSClient
from tests.support.metrics_scrape import scrape, total, value
from tests.support.scaleout_env import TASKS

pytestmark = pytest.mark.skipif(
    find_haproxy() is None, reason="haproxy is not installed (apt-get install -y haproxy; .ci/run installs it)"
)

ENVIRONMENT = "whoami"
EPISODES_PER_CLIENT = 24
EXIT_WAIT_S = 30.0


@pytest.fixture
def topology() -> Iterator[Topology]:
    with Topology(3, 1, ("tests.support.scaleout_env:WhoAmI",), serve_args=("--metrics-port", "0")) as running:
        yield running


async def play(session, index: int) -> tuple[int, ...]:
    """Two `add` steps and `submit` of a WhoAmI episode; the pids of the backend that ran each."""
    task = TASKS[index % len(TASKS)]
    first = await session.call_tool("add", {"a": task["a"], "b": 0})
    second = await session.call_tool("add", {"a": int(first.blocks[0].text), "b": task["b"]})
    result = await session.call_tool("submit", {"answer": int(second.blocks[0].text)})
    assert (result.reward, result.finished) == (1.0, True)
    return tuple(output.metadata["pid"] for output in (first, second, result))


async def episodes_of(env, count: int) -> list[tuple[int, ...]]:
    """`count` episodes at once in `env` (our client's or ors.client's); each one's pids."""

    async def one(index: int) -> tuple[int, ...]:
        async with env.session(split="train", index=index % len(TASKS)) as session:
            return await play(session, index)

    return await asyncio.gather(*(one(index) for index in range(count)))


async def reference_episodes(topology: Topology, count: int) -> list[tuple[int, ...]]:
    """`count` episodes at once by the unmodified `ors.client`, through the bridge in front of HAProxy."""
    client = AsyncORS(base_url=topology.bridge_urls[0])  # held: collecting it closes its HTTP sessions
    env = client.environment(ENVIRONMENT)
    try:
        return await episodes_of(env, count)
    finally:
        await env.client.close()


def sessions_created(samples) -> float:
    return value(samples, "ors_sessions_created_total", environment=ENVIRONMENT)


def refused_creations(samples) -> float:
    return total(samples, "ors_grpc_handled_total", method="CreateEpisode", code="UNAVAILABLE")


async def test_every_session_stays_on_one_backend_and_sessions_spread_over_all(topology: Topology) -> None:
    async with AsyncORSClient(topology.haproxy_target, stream_episodes=False) as by_rpc, \
            AsyncORSClient(topology.haproxy_target) as on_streams:
        played = (await episodes_of(by_rpc.environment(ENVIRONMENT), EPISODES_PER_CLIENT)
                  + await episodes_of(on_streams.environment(ENVIRONMENT), EPISODES_PER_CLIENT))
    played += await reference_episodes(topology, EPISODES_PER_CLIENT)

    assert all(len(set(pids)) == 1 for pids in played), played
    by_backend = {pid: sum(1 for pids in played if pids[0] == pid) for pid in {pids[0] for pids in played}}
    assert set(by_backend) == {backend.pid for backend in topology.backends}, by_backend
    for backend in topology.backends:  # each backend's own count agrees with the results
        assert sessions_created(await scrape(backend.metrics_url)) == by_backend[backend.pid]
    # The stick table holds the ids it routed (ours by RPC, ours on streams, the bridge's).
    table = topology.runtime_api("show table ors_backends")
    assert sum(1 for line in table.splitlines() if " key=" in line) >= 3 * EPISODES_PER_CLIENT, table


async def test_a_backend_set_to_drain_serves_its_open_episode_and_receives_no_creation(topology: Topology) -> None:
    draining = topology.backends[0]
    others = {backend.pid for backend in topology.backends[1:]}
    async with AsyncORSClient(topology.haproxy_target, stream_episodes=False) as client:
        env = client.environment(ENVIRONMENT)
        async with contextlib.AsyncExitStack() as opened:
            while True:  # an episode on the backend to drain: open some until one lands there
                session = await opened.enter_async_context(env.session(split="train", index=0))
                landed = await session.call_tool("add", {"a": 1, "b": 2})
                if landed.metadata["pid"] == draining.pid:
                    held = session
                    break
            # The others close now; `held` stays open across the drain.
            opened.pop_all()
        before = await scrape(draining.metrics_url)

        topology.set_state(0, "drain")
        draining.child.proc.send_signal(signal.SIGTERM)

        played = await episodes_of(env, EPISODES_PER_CLIENT)
        with ORSClient(topology.haproxy_target) as blocking:
            for index in range(EPISODES_PER_CLIENT // 2):
                with blocking.environment(ENVIRONMENT).session(split="train", index=index) as fresh:
                    played.append((fresh.call_tool("add", {"a": 1, "b": 1}).metadata["pid"],))
        played += await reference_episodes(topology, EPISODES_PER_CLIENT)
        assert {pid for pids in played for pid in pids} <= others, played

        after = await scrape(draining.metrics_url)
        assert sessions_created(after) == sessions_created(before)
        assert refused_creations(after) == refused_creations(before) == 0

        # Its open episode still reaches it, through the stick table, to the end.
        assert await play(held, 0) == (draining.pid,) * 3
        assert draining.child.proc.poll() is None
        await held.close()
    status = await asyncio.get_running_loop().run_in_executor(None, draining.child.proc.wait, EXIT_WAIT_S)
    assert status == 0
