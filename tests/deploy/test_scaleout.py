"""Scale-out: 3 `ors-grpc serve` backends behind nginx (consistent hash on x-session-id) behind two
stateless `ors-grpc bridge` processes, driven by the unmodified `ors.client` (ors-sdk), and nginx
driven directly by our Python client (RunEpisode streams).

Affinity is checked from two independent sides: every tool output carries the
pid of the backend that ran it (tests/support/scaleout_env.py), and each backend's own
metrics count exactly the sessions and tool calls those outputs attribute to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from dataclasses import dataclass
from typing import AsyncIterator, Iterator

import aiohttp
import pytest
from ors.client import AsyncORS

from deploy.nginx.run_topology import REPO_ROOT, Topology, find_nginx
from ors_grpc.client import AsyncORSClient
from tests.support.metrics_scrape import scrape, total, value
from tests.support.lost_sessions import call_failure, open_sessions_on_every_backend
from tests.support.scaleout_env import TASKS

pytestmark = pytest.mark.skipif(
    find_nginx() is None, reason="nginx is not installed (apt-get install -y nginx; .ci/run installs it)"
)

BACKENDS = 3
BRIDGES = 2
EPISODES = 300
CONCURRENCY = 50
ENVIRONMENT = "whoami"


@dataclass(frozen=True)
class Episode:
    reward: float
    finished: bool
    answers: tuple[str, ...]
    pids: tuple[int, ...]


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    with Topology(BACKENDS, BRIDGES, ("tests.support.scaleout_env:WhoAmI",)) as running:
        yield running


@contextlib.asynccontextmanager
async def ors_environment(topology: Topology, bridge: int = 0) -> AsyncIterator[object]:
    client = AsyncORS(base_url=topology.bridge_urls[bridge])
    env = client.environment(ENVIRONMENT)
    try:
        yield env
    finally:
        await env.client.close()


async def run_episode(env, index: int) -> Episode:
    """Prompt, two `add` steps, `submit`: the agent's side of one episode."""
    task = TASKS[index % len(TASKS)]
    async with env.session(split="train", index=index % len(TASKS)) as session:
        prompt = await session.get_prompt()
        assert prompt[0].text == f"What is {task['a']} + {task['b']}?"
        first = await session.call_tool("add", {"a": task["a"], "b": 0})
        second = await session.call_tool("add", {"a": int(first.blocks[0].text), "b": task["b"]})
        result = await session.call_tool("submit", {"answer": int(second.blocks[0].text)})
    outputs = (first, second, result)
    return Episode(result.reward, result.finished, tuple(o.blocks[0].text for o in outputs),
                   tuple(o.metadata["pid"] for o in outputs))


async def run_episodes(topology: Topology, count: int) -> list[Episode]:
    """`count` episodes, CONCURRENCY at a time, alternating between the bridges."""
    limit = asyncio.Semaphore(CONCURRENCY)

    async def bounded(envs, index: int) -> Episode:
        async with limit:
            return await run_episode(envs[index % len(envs)], index)

    async with contextlib.AsyncExitStack() as stack:
        envs = [await stack.enter_async_context(ors_environment(topology, bridge))
                for bridge in range(len(topology.bridges))]
        return await asyncio.gather(*(bounded(envs, index) for index in range(count)))


def expected_answers(index: int) -> tuple[str, ...]:
    task = TASKS[index % len(TASKS)]
    return (str(task["a"]), str(task["a"] + task["b"]), "correct")


def assert_correct_and_affine(episodes: list[Episode]) -> Counter[int]:
    """Every episode right, every session on one backend; sessions per backend pid."""
    for index, episode in enumerate(episodes):
        assert (episode.reward, episode.finished, episode.answers) == (1.0, True, expected_answers(index))
        assert len(set(episode.pids)) == 1, f"episode {index} was served by several backends: {episode.pids}"
    return Counter(episode.pids[0] for episode in episodes)


async def test_300_episodes_each_session_on_one_backend_and_every_backend_used(topology: Topology) -> None:
    episodes = await run_episodes(topology, EPISODES)

    sessions_by_pid = assert_correct_and_affine(episodes)
    assert set(sessions_by_pid) == {backend.pid for backend in topology.backends}
    for backend in topology.backends:
        samples = await scrape(backend.metrics_url)
        # The backend's own account agrees with where the results say each session ran.
        sessions = sessions_by_pid[backend.pid]
        assert value(samples, "ors_sessions_created_total", environment=ENVIRONMENT) == sessions
        assert total(samples, "ors_tool_calls_total", environment=ENVIRONMENT, outcome="ok") == 3 * sessions
        assert total(samples, "ors_tool_calls_total", environment=ENVIRONMENT) == 3 * sessions
        assert value(samples, "ors_open_sessions") == 0
    for bridge in topology.bridges:  # each carried its half of the episodes
        samples = await scrape(bridge.metrics_url)
        calls = value(samples, "ors_bridge_requests_total", route="/{env}/call", method="POST", status="200")
        assert calls == 3 * EPISODES / BRIDGES


async def test_our_clients_episode_streams_and_their_side_rpcs_reach_one_backend(topology: Topology) -> None:
    # Through nginx straight to the backends: each episode runs on a RunEpisode
    # stream (30 at a time, so later episodes reuse the streams of earlier
    # ones), and a call made while the stream is busy goes by CallTool; both
    # carry the stream's x-session-id, so both reach the backend holding it.
    limit = asyncio.Semaphore(30)

    async def episode(env, index: int) -> tuple[int, ...]:
        task = TASKS[index % len(TASKS)]
        async with limit, env.session(split="train", index=index % len(TASKS)) as session:
            on_stream, beside = await asyncio.gather(
                session.call_tool("add", {"a": task["a"], "b": 0}), session.call_tool("add", {"a": 0, "b": task["b"]})
            )
            total_ = int(on_stream.blocks[0].text) + int(beside.blocks[0].text)
            result = await session.call_tool("submit", {"answer": total_})
        assert (result.reward, result.finished) == (1.0, True)
        return tuple(output.metadata["pid"] for output in (on_stream, beside, result))

    async with AsyncORSClient(topology.nginx_target) as client:
        env = client.environment(ENVIRONMENT)
        pids = await asyncio.gather(*(episode(env, index) for index in range(120)))
        assert (await client.health()).status == "ok"
    assert all(len(set(episode_pids)) == 1 for episode_pids in pids), pids
    assert {episode_pids[0] for episode_pids in pids} == {backend.pid for backend in topology.backends}


async def test_a_dead_backend_loses_only_its_sessions_and_new_episodes_go_to_live_ones(topology: Topology) -> None:
    victim = topology.backends[0]
    async with ors_environment(topology) as env, contextlib.AsyncExitStack() as stack:
        held = await open_sessions_on_every_backend(env, stack, victim.pid)
        lost = [session for session, pid in held if pid == victim.pid]
        kept = [(session, pid) for session, pid in held if pid != victim.pid]
        assert len(lost) >= 2 and len(kept) >= 2

        topology.kill_backend(0)  # SIGKILL: a crash, no teardown, no goodbye

        for session in lost:
            error = await call_failure(session.call_tool("add", {"a": 1, "b": 1}))
            # nginx passes the call to the next backend on the ring, which does not hold the session.
            message = str(error)
            assert ("404" in message and "Active environment not found" in message) or "503" in message, message
        for session, pid in kept:
            output = await session.call_tool("add", {"a": 2, "b": 3})
            assert (output.blocks[0].text, output.metadata["pid"]) == ("5", pid)

    episodes = await run_episodes(topology, 30)
    sessions_by_pid = assert_correct_and_affine(episodes)
    assert set(sessions_by_pid) <= {backend.pid for backend in topology.backends[1:]}


async def test_with_every_backend_dead_the_bridge_answers_503_with_retry_after(topology: Topology) -> None:
    for index in range(len(topology.backends)):
        topology.kill_backend(index)
    async with aiohttp.ClientSession(base_url=topology.bridge_urls[0]) as http:
        async with http.get("/list_environments") as response:
            assert (response.status, response.headers.get("Retry-After")) == (503, "1")
        async with http.get("/whoami/prompt", headers={"X-Session-ID": "any-session"}) as response:
            assert (response.status, response.headers.get("Retry-After")) == (503, "1")


def test_bench_scaleout_mode_runs_briefly() -> None:
    """`python -m bench --scaleout` (bench/scaleout.py) starts both topologies and prints the ratio;
    no timing assertion, only that it runs without errors."""
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--scaleout", "--workers", "2", "--warmup", "0", "--duration", "0.3"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "scaling ratio (2 backends vs 1)" in done.stdout, done.stdout
    assert "first error" not in done.stdout, done.stdout


def read_until(stream, marker: str) -> list[str]:
    """Lines of `stream` up to the one starting with `marker` (bounded by the test timeout)."""
    lines = []
    for line in stream:
        lines.append(line.rstrip("\n"))
        if line.startswith(marker):
            return lines
    raise AssertionError(f"the script ended before {marker!r}: {lines}")


def test_run_topology_script_serves_and_stops_everything_on_sigint() -> None:
    script = REPO_ROOT / "deploy" / "nginx" / "run_topology.py"
    proc = subprocess.Popen([sys.executable, str(script), "--backends", "2"], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        lines = read_until(proc.stdout, "running;")
        bridge_url = next(line.split()[2].rstrip(",") for line in lines if line.startswith("bridge-0:"))
        backend_pids = [int(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("backend-")]
        with urllib.request.urlopen(f"{bridge_url}/list_environments", timeout=10) as response:
            assert json.load(response) == ["arithmetic"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in backend_pids:  # reaped by the script: gone, not zombies
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
