"""`run_topology.py --check`: episodes through Envoy over both doors and both typed clients.

A third of the episodes goes by the Python client (`ors_grpc.client`, on
RunEpisode streams) to Envoy's gRPC listener, a third by the TypeScript
client (clients/typescript; half by one RPC per step, half on streams) to
the same listener, a third by the standard HTTP client (`ors.client`) to
Envoy's HTTP listener, all at once. Every episode of the example
environment `arithmetic` gets its prompt, calls the calculator and submits
the task's answer; one that raised or was not rewarded 1 is lost.

Affinity is read from two sides: Envoy's access log (every routing key
answered by one backend: no split session) and the backends' own
`ors_sessions_created_total` (they add up to the episodes: the spread).
Then warm episodes: 30 per door prepared for reserved session ids (one
routed prepare per id) and created under those ids; the backends' own
`ors_warm_episodes_ended_total{outcome="claimed"}` counts the claims (at
least 95% are expected).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from deploy.processes import REPO_ROOT
from ors_grpc.protocol.constants import SESSION_ID_HEADER

__all__ = [
    "Outcome", "http_episodes", "python_episodes", "run_check", "run_warm_check", "sessions_created", "task_answers",
    "typescript_episodes",
]

ENVIRONMENT = "arithmetic"
SPLIT = "train"
#: Episodes in flight per client at once.
CONCURRENCY = 10
TYPESCRIPT_CLIENT = REPO_ROOT / "clients" / "typescript"
TYPESCRIPT_EPISODES = TYPESCRIPT_CLIENT / "dist" / "test" / "topology" / "episodes.js"
MAX_ERRORS_SHOWN = 5
NPM_TIMEOUT_S = 600
#: Envoy flushes its access log every 100 ms (run_topology.py).
LOG_FLUSH_S = 0.5


@dataclass
class Outcome:
    """How one client's episodes went."""

    client: str
    episodes: int
    lost: int = 0
    errors: list[str] = field(default_factory=list)

    def failed(self, index: int, error: BaseException | str) -> None:
        self.lost += 1
        if len(self.errors) < MAX_ERRORS_SHOWN:
            self.errors.append(f"episode {index}: {error!r}" if isinstance(error, BaseException) else error)


async def _bounded(count: int, concurrency: int, episode: Any, outcome: Outcome) -> Outcome:
    """Runs `episode(index)` for every index, `concurrency` at a time, counting what raised."""
    limit = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with limit:
            try:
                await episode(index)
            except Exception as error:  # noqa: BLE001 - a lost episode, whatever the cause
                outcome.failed(index, error)

    await asyncio.gather(*(one(index) for index in range(count)))
    return outcome


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


async def play(env: Any, index: int, answers: list[int]) -> None:
    """One episode of task `index` (modulo the tasks) by either Python client (their sessions agree):
    the prompt, the calculator, the answer submitted; AssertionError unless rewarded 1."""
    answer = answers[index % len(answers)]
    async with env.session(split=SPLIT, index=index % len(answers)) as session:
        _expect(bool(await session.get_prompt()), "an empty prompt")
        total = await session.call_tool("calculator", {"a": answer, "b": 0, "op": "+"})
        _expect(total.blocks[0].text == str(answer), f"the calculator said {total.blocks[0].text}")
        done = await session.call_tool("submit", {"answer": answer})
        _expect((done.reward, done.finished) == (1.0, True), f"submit: {done.reward}, {done.finished}")


async def task_answers(target: str) -> list[int]:
    """The answers of the environment's tasks, in order (from their specs)."""
    from ors_grpc.client import AsyncORSClient

    async with AsyncORSClient(target) as client:
        return [task.task_spec["answer"] for task in await client.environment(ENVIRONMENT).list_tasks(SPLIT)]


async def python_episodes(target: str, count: int, answers: list[int], concurrency: int = CONCURRENCY) -> Outcome:
    """`count` episodes with `ors_grpc.client` against a gRPC `target`."""
    from ors_grpc.client import AsyncORSClient

    async with AsyncORSClient(target) as client:
        env = client.environment(ENVIRONMENT)
        return await _bounded(count, concurrency, lambda index: play(env, index, answers), Outcome("python gRPC", count))


async def http_episodes(url: str, count: int, answers: list[int], concurrency: int = CONCURRENCY) -> Outcome:
    """`count` episodes with the standard HTTP client `ors.client` (ors-sdk) against `url`."""
    from ors.client import AsyncORS

    client = AsyncORS(base_url=url)  # kept referenced: its environments share its HTTP session
    env = client.environment(ENVIRONMENT)
    try:
        return await _bounded(count, concurrency, lambda index: play(env, index, answers),
                              Outcome("HTTP ors.client", count))
    finally:
        await env.client.close()  # the environment's HTTP session


def build_typescript_client() -> None:
    """The TypeScript client compiled (`npm ci` builds it), or RuntimeError when node is missing."""
    npm = shutil.which("npm")
    if shutil.which("node") is None or npm is None:
        raise RuntimeError("node and npm are needed for the TypeScript client's episodes")
    if not (TYPESCRIPT_CLIENT / "node_modules").is_dir():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=TYPESCRIPT_CLIENT, check=True,
                       capture_output=True, timeout=NPM_TIMEOUT_S)
    else:
        subprocess.run([str(TYPESCRIPT_CLIENT / "node_modules" / ".bin" / "tsc"), "-p", "."],
                       cwd=TYPESCRIPT_CLIENT, check=True, capture_output=True, timeout=NPM_TIMEOUT_S)


async def typescript_episodes(target: str, count: int, concurrency: int = CONCURRENCY) -> Outcome:
    """`count` episodes with the TypeScript client (clients/typescript/test/topology/episodes.ts)."""
    outcome = Outcome("TypeScript gRPC", count)
    node = await asyncio.create_subprocess_exec(
        "node", str(TYPESCRIPT_EPISODES), cwd=TYPESCRIPT_CLIENT,
        env={**os.environ, "ORS_TARGET": target, "EPISODES": str(count), "CONCURRENCY": str(concurrency)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    stdout, stderr = await node.communicate()
    if node.returncode != 0:
        outcome.lost = count
        outcome.errors.append(f"node exited with {node.returncode}: {stderr.decode(errors='replace')[-2000:]}")
        return outcome
    report = json.loads(stdout.decode().strip().splitlines()[-1])
    outcome.lost, outcome.errors = report["lost"], report["errors"]
    return outcome


def _metric_total(metrics_url: str, name: str, **labels: str) -> float:
    """The sum of a backend's samples of `name` whose labels include `labels`."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def sessions_created(metrics_url: str) -> int:
    """Episodes a backend created, from its own `ors_sessions_created_total`."""
    return round(_metric_total(metrics_url, "ors_sessions_created_total"))


async def mixed_episodes(grpc_target: str, http_url: str, count: int) -> list[Outcome]:
    """`count` episodes split in thirds over the three clients, all running at once."""
    third = count // 3
    answers = await task_answers(grpc_target)
    return list(await asyncio.gather(
        python_episodes(grpc_target, count - 2 * third, answers),
        typescript_episodes(grpc_target, third),
        http_episodes(http_url, third, answers),
    ))


#: Prepared episodes per door in the warm part of the check; claimed must reach this share.
WARM_EPISODES = 30
WARM_CLAIMED_GOAL = 0.95


def warm_tasks(door: str, count: int) -> list[dict[str, Any]]:
    """Task specs of `arithmetic` none of the other episodes uses (a claim needs the same task)."""
    return [{"id": f"warm-{door}-{n}", "question": f"What is {n} + {n}?", "answer": 2 * n} for n in range(count)]


async def python_warm_episodes(target: str, count: int) -> None:
    """Prepares `count` episodes for reserved session ids (one routed prepare each, by
    `ors_grpc.client`), then runs an episode under every id: each should claim its own."""
    from ors_grpc.client import AsyncORSClient

    tasks = warm_tasks("grpc", count)
    ids = [str(uuid.uuid4()) for _ in tasks]
    async with AsyncORSClient(target) as client:
        env = client.environment(ENVIRONMENT)
        await env.prepare(tasks, session_ids=ids)
        for task, sid in zip(tasks, ids):
            async with env.session(task, session_id=sid) as session:
                await session.get_prompt()
                done = await session.call_tool("submit", {"answer": task["answer"]})
                _expect(done.reward == 1.0, f"submit: {done.reward}")


async def http_warm_episodes(url: str, count: int) -> None:
    """The same over the HTTP door: `/{env}/prepare` of one task under an X-Session-ID, then `/create` under it."""
    import aiohttp

    tasks = warm_tasks("http", count)
    ids = [str(uuid.uuid4()) for _ in tasks]
    async with aiohttp.ClientSession(base_url=url) as http:
        for task, sid in zip(tasks, ids):
            async with http.post(f"/{ENVIRONMENT}/prepare", json={"task_specs": [task]},
                                 headers={SESSION_ID_HEADER: sid}) as response:
                _expect(response.status == 200, f"prepare: {response.status} {await response.text()}")
        for task, sid in zip(tasks, ids):
            headers = {SESSION_ID_HEADER: sid}
            async with http.post("/create", json={"env_name": ENVIRONMENT, "task_spec": task}, headers=headers) as response:
                _expect(response.status == 200, f"create: {response.status} {await response.text()}")
            async with http.post("/delete", headers=headers) as response:
                _expect(response.status == 200, f"delete: {response.status}")


def warm_claimed(metrics_url: str) -> int:
    """Prepared episodes a backend saw claimed, from its own `ors_warm_episodes_ended_total`."""
    return round(_metric_total(metrics_url, "ors_warm_episodes_ended_total", outcome="claimed"))


def run_warm_check(topology: Any, per_door: int = WARM_EPISODES) -> tuple[int, list[int]]:
    """Prepared episodes claimed through `topology`'s two doors: (prepared, claimed per backend)."""
    before = [warm_claimed(backend.metrics_url) for backend in topology.backends]

    async def both_doors() -> None:
        await asyncio.gather(python_warm_episodes(topology.grpc_target, per_door),
                             http_warm_episodes(topology.http_url, per_door))

    asyncio.run(both_doors())
    return 2 * per_door, [warm_claimed(backend.metrics_url) - count for backend, count in zip(topology.backends, before)]


def split_sessions(routes: dict[str, set[int]]) -> list[str]:
    """Routing keys whose requests more than one backend answered."""
    return sorted(key for key, backends in routes.items() if len(backends) > 1)


def run_check(topology: Any, episodes: int) -> int:
    """Runs the episodes through `topology` (an EnvoyTopology), prints the
    outcome per client and the spread; 0 when nothing was lost or split."""
    build_typescript_client()
    before = [sessions_created(backend.metrics_url) for backend in topology.backends]
    started = time.perf_counter()
    outcomes = asyncio.run(mixed_episodes(topology.grpc_target, topology.http_url, episodes))
    elapsed = time.perf_counter() - started
    time.sleep(LOG_FLUSH_S)
    created = [sessions_created(backend.metrics_url) - count for backend, count in zip(topology.backends, before)]
    split = split_sessions(topology.routes())
    lost = sum(outcome.lost for outcome in outcomes)
    for outcome in outcomes:
        print(f"{outcome.client}: {outcome.episodes} episodes, {outcome.lost} lost", flush=True)
        for error in outcome.errors:
            print(f"    {error}")
    spread = ", ".join(f"backend-{index} {count}" for index, count in enumerate(created))
    print(f"spread (sessions each backend created): {spread}; {episodes / elapsed:.1f} episodes/s")
    if split:
        print(f"split routing keys (first {MAX_ERRORS_SHOWN}): {split[:MAX_ERRORS_SHOWN]}")
    prepared, claimed = run_warm_check(topology)
    print(f"warm episodes: {prepared} prepared for reserved session ids over both doors, {sum(claimed)} claimed"
          f" ({sum(claimed) / prepared:.0%}), per backend {claimed}")
    print(f"envoy topology: {episodes} episodes, {lost} lost, {len(split)} split sessions", flush=True)
    warm_ok = sum(claimed) >= WARM_CLAIMED_GOAL * prepared
    return 0 if lost == 0 and not split and sum(created) == episodes and warm_ok else 1
