"""Watching environments' code in worker processes (`--workers N`, `--isolation
episode`): the server's /metrics follows its workers, the environment's spans
in a worker nest under the server's, and a worker's log lines name it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path
from typing import Any, Callable

import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc.protocol.errors import CRASH_CAUSE_EXITED, CRASH_CAUSE_SIGNAL, CRASH_CAUSES
from tests.support.metrics_scrape import Samples, announced_metrics_url, scrape, value
from tests.support.otlp_collector import otlp_collector
from tests.support.reliability_helpers import WAIT_S, grpc_call, grpc_episode, grpc_pid, grpc_stub
from tests.support.servers import start_serve
from tests.support.worker_environments import PID_ATTRIBUTE

pytestmark = pytest.mark.timeout(120)

WORKER_PROBE = "tests.support.worker_environments:WorkerProbeEnv"
ENV_NAME = "workerprobeenv"
#: The two ways of running environments' code apart from the server.
MODES = {"workers": ("--workers", "1"), "episode-isolation": ("--isolation", "episode", "--workers", "1")}


def by_worker(samples: Samples, name: str) -> dict[str, float]:
    """`name`'s series by their `worker` label."""
    return {dict(labels)["worker"]: sample for (sample_name, labels), sample in samples.items()
            if sample_name == name}


def restarts(samples: Samples) -> dict[str, float]:
    return {cause: value(samples, "ors_worker_restarts_total", cause=cause) for cause in CRASH_CAUSES}


def no_restarts_but(**counts: int) -> dict[str, float]:
    return {**dict.fromkeys(CRASH_CAUSES, 0.0), **counts}


async def scrape_until(url: str, ready: Callable[[Samples], bool], what: str) -> Samples:
    """Scrape until `ready(samples)` holds; fail naming `what` after WAIT_S."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not ready(samples := await scrape(url)):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return samples


# --- /metrics ------------------------------------------------------------------------


async def test_worker_metrics_follow_workers_as_they_host_episodes_die_and_are_replaced() -> None:
    with start_serve(WORKER_PROBE, "--workers", "2", "--metrics-port", "0") as serve:
        url = announced_metrics_url(serve)
        async with grpc_stub(serve.grpc_target) as stub:
            samples = await scrape(url)
            assert value(samples, "ors_workers_alive") == 2
            assert by_worker(samples, "ors_worker_episodes") == {"1": 0, "2": 0}
            assert set(by_worker(samples, "ors_worker_resident_memory_bytes")) == {"1", "2"}
            assert all(rss > 2**20 for rss in by_worker(samples, "ors_worker_resident_memory_bytes").values())
            assert restarts(samples) == no_restarts_but()  # every cause at 0, there for rate()

            sids = [await grpc_episode(stub, f"episode-{n}", env_name=ENV_NAME) for n in range(3)]
            pids = [await grpc_pid(stub, sid) for sid in sids]
            episodes = by_worker(await scrape(url), "ors_worker_episodes")
            assert sorted(episodes.values()) == [1, 2]

            # A worker killed from outside: its series go, a new worker's come, and the restart is counted.
            doomed = pids[0]
            survivors = [sid for sid, pid in zip(sids, pids) if pid != doomed]
            os.kill(doomed, signal.SIGKILL)
            samples = await scrape_until(
                url, lambda s: "3" in by_worker(s, "ors_worker_episodes") and value(s, "ors_workers_alive") == 2,
                "worker 3 in the killed worker's place")
            episodes = by_worker(samples, "ors_worker_episodes")
            (survivor,) = set(episodes) - {"3"}
            assert episodes == {survivor: len(survivors), "3": 0}
            assert set(by_worker(samples, "ors_worker_resident_memory_bytes")) == {survivor, "3"}
            assert restarts(samples) == no_restarts_but(**{CRASH_CAUSE_SIGNAL: 1})

            # New episodes go to the least-loaded worker, the new one; deleted ones leave their worker.
            await grpc_episode(stub, "fresh", env_name=ENV_NAME)
            await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=survivors[0]))
            episodes = by_worker(await scrape(url), "ors_worker_episodes")
            assert episodes == {survivor: len(survivors) - 1, "3": 1}


async def test_with_episode_isolation_each_episode_process_is_a_worker_and_its_planned_end_no_restart() -> None:
    with start_serve(WORKER_PROBE, *MODES["episode-isolation"], "--metrics-port", "0") as serve:
        url = announced_metrics_url(serve)
        async with grpc_stub(serve.grpc_target) as stub:
            samples = await scrape(url)
            assert value(samples, "ors_workers_alive") == 1
            assert by_worker(samples, "ors_worker_episodes") == {"1": 0}

            # The episode takes the started process; a new one refills the pool.
            done = await grpc_episode(stub, "done", env_name=ENV_NAME)
            samples = await scrape_until(url, lambda s: value(s, "ors_workers_alive") == 2, "the pool refilled")
            assert by_worker(samples, "ors_worker_episodes") == {"1": 1, "2": 0}

            # Its process ends with the episode, as planned: no restart.
            await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=done))
            samples = await scrape_until(url, lambda s: "1" not in by_worker(s, "ors_worker_episodes"),
                                         "the episode's process to end")
            assert restarts(samples) == no_restarts_but()

            # A process that crashes under its episode is a restart, by its cause.
            doomed = await grpc_episode(stub, "doomed", env_name=ENV_NAME)
            with pytest.raises(grpc.aio.AioRpcError) as in_flight:  # answered ENVIRONMENT_CRASHED
                await grpc_call(stub, doomed, "exit_process")
            assert in_flight.value.code() == grpc.StatusCode.ABORTED
            samples = await scrape_until(url, lambda s: "2" not in by_worker(s, "ors_worker_episodes"),
                                         "the crashed process's series to go")
            assert restarts(samples) == no_restarts_but(**{CRASH_CAUSE_EXITED: 1})


# --- tracing -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_spans_the_environment_opens_in_its_process_nest_under_the_servers(mode: str) -> None:
    with otlp_collector("grpc") as (collector, endpoint):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        with start_serve(WORKER_PROBE, *MODES[mode], env=env) as serve:
            asyncio.run(_traced_episode(serve.grpc_target))
            spans = collector.wait_for("ors.setup", "probe.setup", "execute_tool traced", "probe.async_work",
                                       "execute_tool traced_sync", "probe.sync_work")
    for server_name, worker_name in [("ors.setup", "probe.setup"), ("execute_tool traced", "probe.async_work"),
                                     ("execute_tool traced_sync", "probe.sync_work")]:
        server_span, worker_span = spans[server_name], spans[worker_name]
        assert worker_span.trace_id == server_span.trace_id, worker_name
        assert worker_span.parent_span_id == server_span.span_id, worker_name
        assert _attributes(worker_span)[PID_ATTRIBUTE] != serve.proc.pid  # made in the worker process


async def _traced_episode(target: str) -> None:
    async with grpc_stub(target) as stub:
        sid = await grpc_episode(stub, "traced", env_name=ENV_NAME)
        for name in ("traced", "traced_sync"):
            assert (await grpc_call(stub, sid, name))[-1].result.HasField("output"), name
        await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))


def _attributes(span: Any) -> dict[str, Any]:
    return {item.key: getattr(item.value, item.value.WhichOneof("value")) for item in span.attributes}


# --- logs ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_line_the_environment_logs_in_a_worker_names_the_worker(mode: str, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with log.open("w") as stderr, start_serve(WORKER_PROBE, *MODES[mode], stderr=stderr) as serve:
        async with grpc_stub(serve.grpc_target) as stub:
            sid = await grpc_episode(stub, "chatty", env_name=ENV_NAME)
            await grpc_call(stub, sid, "log_tag")
    lines = [line for line in log.read_text().splitlines() if line.endswith(" msg=probe_log tag=chatty")]
    assert len(lines) == 1, log.read_text()
    assert re.search(r" level=WARNING worker=\d+ logger=tests\.support\.worker_environments msg=", lines[0]), lines[0]
