"""Warm episodes that route: behind nginx (consistent hash on `x-session-id`)
with 3 backends, episodes prepared for reserved session ids are claimed by
the creations under those ids, through the gRPC door (the Python client, on
episode streams and by RPC) and the HTTP door (a bridge in front of nginx).

Each prepare goes by its reserved id's route, so it lands where that id's
creation will: every prepared episode is claimed, none expires, and each
backend's own metrics agree. The trainer of docs/deployment.md runs against
it as written, pointed at nginx.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import aiohttp
import pytest

from deploy.nginx.run_topology import Topology, find_nginx
from ors_grpc.client import AsyncORSClient
from tests.support.metrics_scrape import scrape, total

pytestmark = pytest.mark.skipif(
    find_nginx() is None, reason="nginx is not installed (apt-get install -y nginx; .ci/run installs it)"
)

BACKENDS = 3
DOC = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
DOC_TARGET = "127.0.0.1:50051"
EPISODES_PER_DOOR = 30


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    environments = ("tests.support.warm_environments:WarmEnv", "ors_grpc.examples.arithmetic:Arithmetic")
    with Topology(BACKENDS, 1, environments) as running:
        yield running


async def warm_totals(topology: Topology) -> dict[str, list[float]]:
    """Per backend: prepared episodes claimed, and prepared ones still held."""
    samples = [await scrape(backend.metrics_url) for backend in topology.backends]
    return {
        "claimed": [total(s, "ors_warm_episodes_ended_total", outcome="claimed") for s in samples],
        "held": [total(s, "ors_warm_episodes") for s in samples],
    }


@pytest.mark.parametrize("stream_episodes", [True, False], ids=["episode streams", "rpcs"])
async def test_grpc_episodes_claim_the_episodes_prepared_for_their_ids(topology: Topology, stream_episodes: bool):
    before = await warm_totals(topology)
    tasks = [{"tag": f"grpc-{stream_episodes}-{n}"} for n in range(EPISODES_PER_DOOR)]
    session_ids = [str(uuid.uuid4()) for _ in tasks]
    async with AsyncORSClient(topology.nginx_target, stream_episodes=stream_episodes) as client:
        env = client.environment("warmenv")
        assert await env.prepare(tasks, session_ids=session_ids) == EPISODES_PER_DOOR
        for task, sid in zip(tasks, session_ids):
            async with env.session(task, session_id=sid) as session:
                assert (await session.get_prompt())[0].text.endswith(f"of {task['tag']}")
    after = await warm_totals(topology)
    claimed = [now - then for now, then in zip(after["claimed"], before["claimed"])]
    print(f"warm routing ({'streams' if stream_episodes else 'rpcs'}): "
          f"{sum(claimed)}/{EPISODES_PER_DOOR} prepared episodes claimed, per backend {claimed}")
    assert sum(claimed) == EPISODES_PER_DOOR
    assert sum(1 for count in claimed if count) > 1  # the ids spread over the backends
    assert after["held"] == [0.0] * BACKENDS


async def test_http_creations_claim_the_episodes_prepared_under_their_x_session_id(topology: Topology):
    before = await warm_totals(topology)
    async with aiohttp.ClientSession(base_url=topology.bridge_urls[0]) as http:
        sids = []
        for n in range(EPISODES_PER_DOOR):
            headers = {"X-Session-ID": str(uuid.uuid4())}
            async with http.post("/warmenv/prepare", json={"task_specs": [{"tag": f"http-{n}"}]},
                                 headers=headers) as response:
                assert response.status == 200, await response.text()
            sids.append(headers["X-Session-ID"])
        for n, sid in enumerate(sids):
            headers = {"X-Session-ID": sid}
            async with http.post("/create", json={"task_spec": {"tag": f"http-{n}"}}, headers=headers) as response:
                assert response.status == 200, await response.text()
            async with http.post("/delete", headers=headers) as response:
                assert response.status == 200
    after = await warm_totals(topology)
    claimed = [now - then for now, then in zip(after["claimed"], before["claimed"])]
    print(f"warm routing (http): {sum(claimed)}/{EPISODES_PER_DOOR} prepared episodes claimed, per backend {claimed}")
    assert sum(claimed) == EPISODES_PER_DOOR
    assert after["held"] == [0.0] * BACKENDS


def trainer_of_the_docs() -> str:
    section = DOC.read_text().split("## Warm episodes that route", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"^```python\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    return code


async def test_the_trainer_of_the_docs_claims_every_episode_it_prepared(topology: Topology):
    before = await warm_totals(topology)
    code = trainer_of_the_docs().replace(DOC_TARGET, topology.nginx_target)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [f"batch {number}: rewards [1.0, 1.0, 1.0, 1.0]" for number in range(3)]
    after = await warm_totals(topology)
    assert sum(after["claimed"]) - sum(before["claimed"]) == 12
    assert after["held"] == [0.0] * BACKENDS
