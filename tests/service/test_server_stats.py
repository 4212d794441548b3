"""GetServerStats: the server's own counters per environment, for the live view.

Through a real server on loopback; the counters' window arithmetic with a
clock the test moves (`EnvironmentCounters`, the runtime's own class).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._runtime.server_stats import WINDOW_S, EnvironmentCounters
from ors_grpc.server import ServerConfig
from tests.support.grpc_calls import call_tool, create_episode, expect_error, serving


def by_name(response: pb.GetServerStatsResponse) -> dict[str, pb.EnvironmentStats]:
    return {stats.env_name: stats for stats in response.environments}


async def test_an_idle_server_lists_every_environment_with_nothing_counted(stub) -> None:
    response = await stub.GetServerStats(pb.GetServerStatsRequest())
    assert [stats.env_name for stats in response.environments] == ["echoenv", "slowsetupenv", "failingsetupenv"]
    assert response.window_seconds == WINDOW_S
    echo = by_name(response)["echoenv"]
    assert (echo.open_sessions, echo.prepared_episodes, echo.tool_calls_in_flight) == (0, 0, 0)
    assert echo.tool_calls_per_second == 0.0
    assert not echo.HasField("call_latency_p50_ms") and not echo.HasField("call_latency_p99_ms")
    assert list(echo.recent_errors) == []


async def test_open_sessions_and_prepared_episodes_are_counted_per_environment(stub) -> None:
    first = await create_episode(stub)
    await create_episode(stub)
    await create_episode(stub, env_name="slowsetupenv")
    prepare = pb.PrepareEpisodesRequest(env_name="echoenv", split="train", indices=[0])
    await stub.PrepareEpisodes(prepare)

    stats = by_name(await stub.GetServerStats(pb.GetServerStatsRequest()))
    assert (stats["echoenv"].open_sessions, stats["echoenv"].prepared_episodes) == (2, 1)
    assert (stats["slowsetupenv"].open_sessions, stats["slowsetupenv"].prepared_episodes) == (1, 0)

    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=first))
    assert by_name(await stub.GetServerStats(pb.GetServerStatsRequest()))["echoenv"].open_sessions == 1


async def test_tool_calls_give_a_rate_and_latencies(stub) -> None:
    sid = await create_episode(stub)
    for text in ("a", "b", "c"):
        await call_tool(stub, sid, "echo", {"text": text})
    echo = by_name(await stub.GetServerStats(pb.GetServerStatsRequest()))["echoenv"]
    assert echo.tool_calls_per_second > 0
    assert 0 < echo.call_latency_p50_ms <= echo.call_latency_p99_ms
    assert echo.tool_calls_in_flight == 0


async def test_a_call_in_flight_is_counted_while_it_runs(stub) -> None:
    sid = await create_episode(stub)
    running = asyncio.ensure_future(call_tool(stub, sid, "sleep", {"seconds": 2}))
    seen_in_flight = 0
    try:
        while not running.done() and not seen_in_flight:
            stats = by_name(await stub.GetServerStats(pb.GetServerStatsRequest()))["echoenv"]
            seen_in_flight = stats.tool_calls_in_flight
            await asyncio.sleep(0.01)
    finally:
        await running
    assert seen_in_flight == 1
    assert by_name(await stub.GetServerStats(pb.GetServerStatsRequest()))["echoenv"].tool_calls_in_flight == 0


async def test_failed_tools_and_setups_are_the_last_errors_newest_first(stub) -> None:
    sid = await create_episode(stub, secrets={"TOKEN": "boom"})
    _, outcome = await call_tool(stub, sid, "fail")
    assert outcome.failure.message == "***"  # the session's secret, masked as the client sees it
    broken = await create_episode(stub, env_name="failingsetupenv")
    await expect_error(stub.GetPrompt(pb.GetPromptRequest(session_id=broken)))

    stats = by_name(await stub.GetServerStats(pb.GetServerStatsRequest()))
    assert [(error.source, error.message) for error in stats["echoenv"].recent_errors] == [("tool fail", "***")]
    assert [(error.source, error.message) for error in stats["failingsetupenv"].recent_errors] == [
        ("setup", "RuntimeError: setup exploded")]
    assert stats["echoenv"].recent_errors[0].time_unix_ms > 0

    await call_tool(stub, sid, "fail")
    await call_tool(stub, sid, "echo", {"text": "fine"})
    errors = by_name(await stub.GetServerStats(pb.GetServerStatsRequest()))["echoenv"].recent_errors
    assert len(errors) == 2 and errors[0].time_unix_ms >= errors[1].time_unix_ms


async def test_the_stats_need_the_api_key() -> None:
    async with serving(config=ServerConfig(api_key="sesame")) as stub:
        error = await expect_error(stub.GetServerStats(pb.GetServerStatsRequest()))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        response = await stub.GetServerStats(pb.GetServerStatsRequest(), metadata=(("x-api-key", "sesame"),))
        assert response.environments


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def ended_call(counters: EnvironmentCounters, clock: Clock, seconds: float, failure: str | None = None) -> None:
    started = counters.call_started()
    clock.now += seconds
    counters.call_ended("t", started, failure)


async def test_the_window_forgets_old_calls_and_the_rate_counts_the_uptime_until_it_is_full() -> None:
    clock = Clock()
    counters = EnvironmentCounters(clock)
    for _ in range(10):
        await ended_call(counters, clock, 0.5)  # 10 calls in the first 5 s
    assert counters.calls_per_second() == pytest.approx(10 / 5)
    assert counters.latency_ms(0.5, 0.99) == [pytest.approx(500), pytest.approx(500)]

    clock.now += WINDOW_S
    assert counters.calls_per_second() == 0.0
    assert counters.latency_ms(0.5) is None


async def test_the_percentiles_are_nearest_rank_over_the_window() -> None:
    clock = Clock()
    counters = EnvironmentCounters(clock)
    for milliseconds in range(1, 101):  # 1 ms .. 100 ms
        await ended_call(counters, clock, milliseconds / 1000)
    p50, p99 = counters.latency_ms(0.5, 0.99)
    assert (p50, p99) == (pytest.approx(50), pytest.approx(99))


async def test_only_the_last_errors_are_kept() -> None:
    clock = Clock()
    counters = EnvironmentCounters(clock)
    for number in range(15):
        await ended_call(counters, clock, 0.001, failure=f"error {number}")
    messages = [error.message for error in counters.recent_errors()]
    assert messages == [f"error {number}" for number in range(14, 4, -1)]
