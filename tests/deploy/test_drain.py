"""A backend drained behind nginx (consistent hash on `x-session-id`): its
open episode is served to its end, new episodes go elsewhere, it exits.

nginx has no active health checks, so it keeps sending the draining backend
its share of the hash: the episode open there goes on (its per-step RPCs are
routed by its id), and the creations whose new ids hash there are refused
with DRAINING and made again by the clients (Python async and sync, by
stream and by RPC; TypeScript by RPC and on streams) under new ids, until
one lands on the other backend.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Iterator

import pytest

from deploy.nginx.run_topology import Topology, find_nginx
from ors_grpc.client import AsyncORSClient, ORSClient
from tests.support.metrics_scrape import scrape, total
from tests.support.scaleout_env import TASKS
from tests.support.typescript import compile_client, run_suites, suites, tap_count

pytestmark = pytest.mark.skipif(
    find_nginx() is None, reason="nginx is not installed (apt-get install -y nginx; .ci/run installs it)"
)

EPISODES_PER_CLIENT = 20
EXIT_WAIT_S = 30.0


@pytest.fixture
def topology() -> Iterator[Topology]:
    with Topology(2, 0, ("tests.support.scaleout_env:WhoAmI",)) as running:
        yield running


async def play(session, index: int) -> list[int]:
    """Two steps of a WhoAmI episode; the pids of the backend that ran each."""
    task = TASKS[index % len(TASKS)]
    added = await session.call_tool("add", {"a": task["a"], "b": task["b"]})
    submitted = await session.call_tool("submit", {"answer": task["a"] + task["b"]})
    assert submitted.reward == 1.0
    return [added.metadata["pid"], submitted.metadata["pid"]]


def refused_creations(samples) -> float:
    return total(samples, "ors_grpc_handled_total", method="CreateEpisode", code="UNAVAILABLE")


def streams(samples) -> float:
    """RunEpisode streams ended: on the draining backend, each one a refused creation."""
    return total(samples, "ors_grpc_handled_total", method="RunEpisode")


async def test_a_drained_backend_serves_its_episode_to_the_end_while_clients_create_theirs_elsewhere(
    topology: Topology,
) -> None:
    draining, other = topology.backends
    async with AsyncORSClient(topology.nginx_target, stream_episodes=False) as by_rpc, \
            AsyncORSClient(topology.nginx_target) as on_streams:
        env = by_rpc.environment("whoami")
        # An episode on the backend to drain: open some until one lands there.
        opened = []
        while True:
            session = env.session(split="train", index=0)
            await session.__aenter__()
            added = await session.call_tool("add", {"a": 1, "b": 2})
            if added.metadata["pid"] == draining.pid:
                break
            opened.append(session)
        for extra in opened:
            await extra.close()

        draining.child.proc.send_signal(signal.SIGTERM)
        for client in (by_rpc, on_streams):
            for index in range(EPISODES_PER_CLIENT):
                async with client.environment("whoami").session(split="train", index=index) as fresh:
                    assert set(await play(fresh, index)) == {other.pid}
        with ORSClient(topology.nginx_target) as blocking:
            for index in range(EPISODES_PER_CLIENT):
                with blocking.environment("whoami").session(split="train", index=index) as fresh:
                    task = TASKS[index]
                    output = fresh.call_tool("add", {"a": task["a"], "b": task["b"]})
                    assert output.metadata["pid"] == other.pid
        before_typescript = await scrape(draining.metrics_url)
        assert refused_creations(before_typescript) > 0

        await asyncio.get_running_loop().run_in_executor(None, compile_client)
        result = await asyncio.get_running_loop().run_in_executor(
            None, lambda: run_suites(topology.nginx_target, suites("whoami"), ORS_DRAINING_PID=str(draining.pid)))
        assert result.returncode == 0, result.stdout + result.stderr
        assert tap_count(result.stdout, "pass") == tap_count(result.stdout, "tests") == 2, result.stdout
        after_typescript = await scrape(draining.metrics_url)
        assert refused_creations(after_typescript) > refused_creations(before_typescript)  # by RPC
        assert streams(after_typescript) > streams(before_typescript)  # on streams

        # The drained backend's episode is still served, by its per-step RPCs through nginx.
        assert (await play(session, 0)) == [draining.pid] * 2
        assert draining.child.proc.poll() is None
        await session.close()
    status = await asyncio.get_running_loop().run_in_executor(None, draining.child.proc.wait, EXIT_WAIT_S)
    assert status == 0
