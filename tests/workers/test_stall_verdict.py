"""The watchdog's verdicts on their own: the stall verdict (held loop, silence), the server's own
pauses forgiven, the memory limit. No process: rows with what their heartbeats said."""

from __future__ import annotations

import pytest

from ors_grpc._runtime.workers.watchdog import (
    HELD, SILENT, Watchdog, heartbeat_interval_s, loop_stalled, stall_verdict,
)
from ors_grpc.protocol.errors import CRASH_CAUSE_MEMORY_LIMIT, CRASH_CAUSE_STALLED
from tests.workers._fakes import worker_process


@pytest.mark.parametrize("held_s, silent_s, verdict", [
    (0.0, 0.0, None),
    (59.9, 59.9, None),  # at most the limit: alive, however loaded
    (60.1, 0.5, HELD),  # one callback held the loop past the limit, though heartbeats come
    (0.0, 60.1, SILENT),  # nothing heard past the limit
    (61.0, 61.0, HELD),  # the held loop is named first: the heartbeat says what it was
])
def test_the_stall_verdict(held_s: float, silent_s: float, verdict: str | None) -> None:
    assert stall_verdict(held_s, silent_s, 60.0) == verdict


def test_a_limit_of_zero_never_judges() -> None:
    assert stall_verdict(1e6, 1e6, 0.0) is None
    assert heartbeat_interval_s(0.0) == 0.0


def test_heartbeats_come_at_least_four_times_per_limit() -> None:
    assert heartbeat_interval_s(60.0) == 1.0
    assert heartbeat_interval_s(2.0) == 0.5


def _watched(limit_s: float = 2.0, **fields: float):
    process = worker_process(1, episodes=3, started_at=0.0)
    process.heard_at = 0.0
    for name, value in fields.items():
        setattr(process, name, value)
    return process, Watchdog(stall_limit_s=limit_s, memory_limit_bytes=None)


def _tick(watchdog: Watchdog, process, times: list[float]) -> list:
    kills = []
    for now in times:
        kills += watchdog.look(now, [process])
    return kills


def test_the_watchdog_kills_a_worker_that_fell_silent_past_the_limit() -> None:
    process, watchdog = _watched()
    times = [0.5 * i for i in range(1, 6)]  # it looks every heartbeat period (0.5 s): silent up to 2.5 s
    (kill,) = _tick(watchdog, process, times)
    assert kill.process is process and kill.cause == CRASH_CAUSE_STALLED
    assert f"reason={SILENT}" in kill.why and "episodes=3" in kill.why


def test_the_watchdog_kills_a_worker_whose_loop_one_callback_holds() -> None:
    process, watchdog = _watched(held_s=2.5)
    kills = _tick(watchdog, process, [0.0, 0.5])
    assert [kill.why.split("reason=")[1].split()[0] for kill in kills] == [HELD]


def test_silence_while_the_servers_own_loop_was_held_is_forgiven() -> None:
    process, watchdog = _watched()
    watchdog.look(0.0, [process])
    # The server's loop was held for 5 s: the heartbeats may be waiting unread. Silence counts afresh.
    assert watchdog.look(5.0, [process]) == []
    assert process.heard_at == 4.5
    assert watchdog.look(5.5, [process]) == []
    assert [k.cause for k in _tick(watchdog, process, [6.0, 6.5, 7.0])] == [CRASH_CAUSE_STALLED]


def test_a_worker_already_killed_or_not_yet_heard_is_not_judged() -> None:
    process, watchdog = _watched()
    process.connection.killed_because = "tool_timeout"
    assert _tick(watchdog, process, [0.5 * i for i in range(1, 10)]) == []
    process, watchdog = _watched()
    process.heard_at = None
    assert _tick(watchdog, process, [0.5 * i for i in range(1, 10)]) == []


def test_the_memory_limit() -> None:
    process = worker_process(7)
    sizes = {4242: 300 * 2**20}
    watchdog = Watchdog(stall_limit_s=0.0, memory_limit_bytes=256 * 2**20, rss=sizes.get)
    assert watchdog.look(0.0, [process]) == []  # the first reading comes a poll period later
    (kill,) = watchdog.look(1.0, [process])
    assert kill.cause == CRASH_CAUSE_MEMORY_LIMIT and "rss_mib=300 limit_mib=256" in kill.why
    sizes[4242] = 200 * 2**20
    assert watchdog.look(2.0, [process]) == []
    del sizes[4242]  # gone: nothing to read
    assert watchdog.look(3.0, [process]) == []


def test_nothing_to_watch_means_no_tick_is_due() -> None:
    assert Watchdog(stall_limit_s=0.0, memory_limit_bytes=None).next_due(10.0) is None
    assert Watchdog(stall_limit_s=2.0, memory_limit_bytes=None).next_due(10.0) == 10.5


@pytest.mark.parametrize("held_s, silent_s, stalled", [
    (0.0, 0.0, False),
    (0.7, 1.1, False),  # what load makes (docs/workers.md): a loaded worker still takes episodes
    (2.1, 0.5, True),  # one callback has held the loop past two heartbeat periods
    (0.0, 30.0, False),  # silence alone does not: heartbeats read late by a busy server would look so
])
def test_a_worker_whose_loop_is_held_takes_no_new_episode_long_before_it_is_killed(
        held_s: float, silent_s: float, stalled: bool) -> None:
    assert loop_stalled(held_s, heartbeat_interval_s(60.0)) is stalled
    process, watchdog = _watched(60.0, held_s=held_s)
    assert watchdog.stalled(process) is stalled
    assert stall_verdict(held_s, silent_s, 60.0) is None  # and not killed: far from the limit


def test_without_a_stall_limit_no_worker_is_ever_stalled() -> None:
    assert not loop_stalled(1e6, heartbeat_interval_s(0.0))
