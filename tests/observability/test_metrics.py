"""Prometheus metrics: `ors-grpc serve --metrics-port`, `ors-grpc bridge --metrics-port`, and the
service's counters observed in-process (reaper, failed setup, rejected key)."""

from __future__ import annotations

import asyncio
import math
from typing import AsyncIterator

import aiohttp
import grpc
import pytest
from prometheus_client import REGISTRY

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc.server import ServerConfig
from tests.support.bridge_http import call, create_episode
from tests.support.grpc_calls import create_episode as create_grpc_episode
from tests.support.grpc_calls import expect_error, serving
from tests.support.metrics_scrape import Samples, announced_metrics_url, scrape, total, value
from tests.support.servers import start_bridge, start_serve

ENVIRONMENT = "tests.support.environments:EchoEnv"
POLL_ATTEMPTS = 100  # x 0.1 s


async def poll_metrics(url: str, ready) -> Samples:
    """Scrape until `ready(samples)` holds (bounded); the last scrape."""
    for _ in range(POLL_ATTEMPTS):
        samples = await scrape(url)
        if ready(samples):
            return samples
        await asyncio.sleep(0.1)
    return samples


@pytest.fixture
async def serve_http() -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """`ors-grpc serve --http-port 0 --metrics-port 0`: an HTTP client on its bridge, its metrics URL."""
    with start_serve(ENVIRONMENT, "--http-port", "0", "--metrics-port", "0") as serve:
        metrics_url = announced_metrics_url(serve)
        async with aiohttp.ClientSession(base_url=serve.http_url) as http:
            yield http, metrics_url


async def test_serve_counts_sessions_tool_calls_errors_and_bridge_requests(
    serve_http: tuple[aiohttp.ClientSession, str],
) -> None:
    http, metrics_url = serve_http
    sid = await create_episode(http, {"split": "train", "index": 0})
    assert (await call(http, sid, "echo", {"text": "hi"})).result()["ok"] is True
    assert (await call(http, sid, "no_such_tool", {})).result()["ok"] is False
    assert (await call(http, sid, "fail", {})).names() == ["task_id", "error"]
    async with http.post("/ping", headers={"X-Session-ID": "not-a-session"}) as response:
        assert response.status == 404

    samples = await scrape(metrics_url)
    assert value(samples, "ors_open_sessions") == 1
    assert value(samples, "ors_sessions_created_total", environment="echoenv") == 1
    assert value(samples, "ors_setup_duration_seconds_count", environment="echoenv", outcome="ok") == 1
    assert value(samples, "ors_tool_calls_total", environment="echoenv", tool="echo", outcome="ok") == 1
    # A client-chosen tool name never becomes a label value.
    assert value(samples, "ors_tool_calls_total", environment="echoenv", tool="unknown", outcome="refused") == 1
    assert value(samples, "ors_tool_calls_total", environment="echoenv", tool="fail", outcome="failed") == 1
    assert value(samples, "ors_tool_call_duration_seconds_count", environment="echoenv", tool="echo") == 1
    assert value(samples, "ors_tool_calls_in_flight", environment="echoenv") == 0
    assert value(samples, "ors_grpc_handled_total", method="Ping", code="NOT_FOUND") == 1
    assert value(samples, "ors_grpc_handled_total", method="CallTool", code="OK") == 3
    # The bridge of `serve --http-port` reports into the same exposition.
    assert value(samples, "ors_bridge_requests_total", route="/{env}/call", method="POST", status="200") == 3
    assert value(samples, "ors_bridge_requests_total", route="/ping", method="POST", status="404") == 1
    assert value(samples, "ors_bridge_request_duration_seconds_count", route="/{env}/call", method="POST") == 3

    async with http.post("/delete", headers={"X-Session-ID": sid}) as response:
        assert response.status == 200
    assert value(await scrape(metrics_url), "ors_open_sessions") == 0


async def test_a_running_tool_is_in_flight_until_its_session_ends(
    serve_http: tuple[aiohttp.ClientSession, str],
) -> None:
    http, metrics_url = serve_http
    sid = await create_episode(http, {"split": "train", "index": 0})
    sleeping = asyncio.create_task(call(http, sid, "sleep", {"seconds": 60}))
    try:
        samples = await poll_metrics(metrics_url, lambda s: value(s, "ors_tool_calls_in_flight", environment="echoenv") == 1)
        assert value(samples, "ors_tool_calls_in_flight", environment="echoenv") == 1
        async with http.post("/delete", headers={"X-Session-ID": sid}) as response:
            assert response.status == 200
        samples = await poll_metrics(metrics_url, lambda s: value(s, "ors_tool_calls_in_flight", environment="echoenv") == 0)
        assert value(samples, "ors_tool_calls_in_flight", environment="echoenv") == 0
        assert value(samples, "ors_tool_calls_total", environment="echoenv", tool="sleep", outcome="cancelled") == 1
    finally:
        sleeping.cancel()
        await asyncio.gather(sleeping, return_exceptions=True)


async def test_bridge_alone_exposes_requests_by_route_and_status() -> None:
    with start_serve(ENVIRONMENT) as backend, start_bridge(backend.grpc_target, "--metrics-port", "0") as bridge:
        metrics_url = announced_metrics_url(bridge)
        async with aiohttp.ClientSession(base_url=bridge.http_url) as http:
            for _ in range(2):
                async with http.get("/list_environments") as response:
                    assert response.status == 200
            async with http.get("/echoenv/prompt") as response:
                assert response.status == 400  # no X-Session-ID
            for method in ("PROPFIND", "PURGE"):
                async with http.request(method, "/list_environments") as response:
                    assert response.status == 405
        samples = await scrape(metrics_url)
    assert value(samples, "ors_bridge_requests_total", route="/list_environments", method="GET", status="200") == 2
    assert value(samples, "ors_bridge_requests_total", route="/{env}/prompt", method="GET", status="400") == 1
    # A client cannot mint label values with methods of its own.
    assert value(samples, "ors_bridge_requests_total", route="unmatched", method="other", status="405") == 2
    # The bridge process holds no sessions: the service's gauges stay at zero there.
    assert total(samples, "ors_sessions_created_total") == 0


# --- in-process: the default registry of this test process, read as deltas ---------


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_reaped_sessions_are_counted() -> None:
    before = sample("ors_sessions_reaped_total")
    async with serving(config=ServerConfig(session_timeout_s=0.2, reaper_interval_s=0.1)) as stub:
        sid = await create_grpc_episode(stub)
        for _ in range(POLL_ATTEMPTS):
            try:
                await stub.Ping(pb.PingRequest(session_id=sid))
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.NOT_FOUND
                break
            await asyncio.sleep(0.3)  # longer than the timeout: the ping itself is activity
    assert sample("ors_sessions_reaped_total") - before == 1


async def test_failed_setup_is_observed_with_its_outcome() -> None:
    labels = {"environment": "failingsetupenv", "outcome": "failed"}
    before = sample("ors_setup_duration_seconds_count", **labels)
    async with serving() as stub:
        sid = await create_grpc_episode(stub, env_name="failingsetupenv")
        await expect_error(stub.GetPrompt(pb.GetPromptRequest(session_id=sid)))
    assert sample("ors_setup_duration_seconds_count", **labels) - before == 1


async def test_calls_rejected_by_the_key_check_are_counted_by_code() -> None:
    labels = {"method": "ListEnvironments", "code": "UNAUTHENTICATED"}
    before = sample("ors_grpc_handled_total", **labels)
    async with serving(config=ServerConfig(api_key="the-key")) as stub:
        error = await expect_error(stub.ListEnvironments(pb.ListEnvironmentsRequest()))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert sample("ors_grpc_handled_total", **labels) - before == 1


async def test_an_episode_over_run_episode_counts_one_rpc_and_its_tool_calls() -> None:
    rpc = {"method": "RunEpisode", "code": "OK"}
    calls = {"environment": "echoenv", "tool": "echo", "outcome": "ok"}
    before = sample("ors_grpc_handled_total", **rpc), sample("ors_tool_calls_total", **calls)
    async with serving() as stub:
        episode = stub.RunEpisode()
        create = pb.CreateEpisodeRequest(env_name="echoenv", task_index=pb.TaskIndex(split="train", index=0))
        for step in (
            pb.RunEpisodeRequest(create=create),
            pb.RunEpisodeRequest(call_tool=pb.ToolCallStep(name="echo", input={"json": '{"text": "hi"}'}, task_id="1")),
            pb.RunEpisodeRequest(delete=pb.DeleteEpisodeRequest()),
        ):
            await episode.write(step)
            assert (await episode.read()).WhichOneof("step") != "error"
        await episode.done_writing()
        assert await episode.code() == grpc.StatusCode.OK
    after = sample("ors_grpc_handled_total", **rpc), sample("ors_tool_calls_total", **calls)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


async def test_session_load_is_open_and_warm_sessions_over_max_sessions() -> None:
    async with serving(config=ServerConfig(max_sessions=4)) as stub:
        assert sample("ors_session_load") == 0
        first = await create_grpc_episode(stub)
        await create_grpc_episode(stub)
        assert sample("ors_session_load") == 0.5
        await stub.PrepareEpisodes(pb.PrepareEpisodesRequest(env_name="echoenv", task_specs=[types_pb2.JsonValue(json="{}")]))
        assert sample("ors_session_load") == 0.75  # a warm episode holds a place too
        await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=first))
        assert sample("ors_session_load") == 0.5


async def test_session_load_is_not_a_number_without_max_sessions() -> None:
    async with serving() as stub:
        await create_grpc_episode(stub)
        assert math.isnan(REGISTRY.get_sample_value("ors_session_load"))
