"""The crash-loop backoff on its own: what a run of failures costs, and what ends it."""

from __future__ import annotations

from ors_grpc._runtime.workers.backoff import (
    CRASH_LOOP_FAILURES, MAX_RESTART_BACKOFF_S, YOUNG_DEATH_S, RestartBackoff,
)


def test_no_failure_no_wait() -> None:
    backoff = RestartBackoff()
    assert backoff.delay_s == 0.0
    assert not backoff.failing
    assert backoff.may_start(0.0)


def test_each_failure_in_a_row_doubles_the_wait_up_to_the_cap() -> None:
    backoff = RestartBackoff()
    waits = []
    for _ in range(10):
        backoff.failed(100.0)
        waits.append(backoff.delay_s)
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, MAX_RESTART_BACKOFF_S, MAX_RESTART_BACKOFF_S,
                     MAX_RESTART_BACKOFF_S, MAX_RESTART_BACKOFF_S]


def test_no_start_before_the_wait_is_over() -> None:
    backoff = RestartBackoff()
    backoff.failed(100.0)
    backoff.failed(101.0)  # one second: the second failure in a row
    assert not backoff.may_start(101.9)
    assert backoff.may_start(102.0)


def test_the_crash_loop_is_announced_once_as_it_begins() -> None:
    backoff = RestartBackoff()
    announced = [backoff.failed(float(t)) for t in range(CRASH_LOOP_FAILURES + 3)]
    assert announced == [t == CRASH_LOOP_FAILURES - 1 for t in range(CRASH_LOOP_FAILURES + 3)]


def test_a_young_death_is_a_failure_and_an_old_one_ends_the_run() -> None:
    backoff = RestartBackoff()
    backoff.ended(lived_s=YOUNG_DEATH_S - 0.1, now=50.0)
    backoff.ended(lived_s=1.0, now=51.0)
    assert backoff.failures == 2 and backoff.failing
    backoff.ended(lived_s=YOUNG_DEATH_S, now=90.0)
    assert backoff.failures == 0 and not backoff.failing
    assert backoff.delay_s == 0.0 and backoff.may_start(90.0)


def test_proof_of_health_ends_the_run_and_the_wait() -> None:
    backoff = RestartBackoff()
    for t in range(4):
        backoff.failed(float(t))
    backoff.proved()
    assert not backoff.failing
    assert backoff.may_start(3.0)
    assert not backoff.failed(10.0)  # a new run starts from the first wait, not a crash loop
    assert backoff.delay_s == 0.5
