"""The placements on their own: which process takes a new episode or a class-level call, how many
the pool keeps, and when it is serving; over a process table of stand-ins (no process)."""

from __future__ import annotations

import pytest

from ors_grpc._runtime.workers.placement import SPAWN, EpisodePlacement, SharedPlacement, worker_count
from ors_grpc._runtime.workers.process_table import ProcessState, ProcessTable
from tests.workers._fakes import worker_process

STARTING, READY, CLAIMED = ProcessState.STARTING, ProcessState.READY, ProcessState.CLAIMED


def _table(*rows: tuple[int, ProcessState, int, bool]) -> ProcessTable:
    """Rows of (worker id, state, episodes, alive)."""
    table = ProcessTable()
    for worker_id, state, episodes, alive in rows:
        process = worker_process(worker_id, episodes=episodes, alive=alive)
        table.add(process)
        if state is not STARTING:
            table.move(process, state)
    return table


def test_shared_a_new_episode_goes_to_the_least_loaded_live_ready_process() -> None:
    table = _table((1, READY, 5, True), (2, READY, 2, True), (3, READY, 0, False), (4, STARTING, 0, True))
    placement = SharedPlacement(4)
    assert placement.for_episode(table).worker_id == 2
    assert placement.for_catalog(table).worker_id == 2


def test_shared_ties_go_to_the_one_ready_first() -> None:
    table = _table((1, READY, 1, True), (2, READY, 1, True))
    assert SharedPlacement(2).for_episode(table).worker_id == 1


def test_shared_none_up_is_none_and_not_serving() -> None:
    table = _table((1, READY, 0, False), (2, STARTING, 0, True))
    placement = SharedPlacement(2)
    assert placement.for_episode(table, can_spawn=True) is None
    assert not placement.serving(table, can_spawn=True)
    assert placement.serving(_table((1, READY, 9, True)), can_spawn=False)


def test_shared_keeps_its_size_counting_every_process_until_it_is_reaped() -> None:
    placement = SharedPlacement(3)
    assert placement.to_spawn(ProcessTable()) == 3
    assert placement.to_spawn(_table((1, READY, 0, False), (2, STARTING, 0, True))) == 1
    assert placement.to_spawn(_table(*((i, READY, 0, True) for i in range(1, 5)))) == 0


def test_per_episode_a_new_episode_takes_the_oldest_live_idle_process() -> None:
    table = _table((1, CLAIMED, 1, True), (2, READY, 0, False), (3, READY, 0, True), (4, READY, 0, True))
    placement = EpisodePlacement(2)
    assert placement.for_episode(table, can_spawn=True).worker_id == 3
    assert placement.for_catalog(table).worker_id == 3


def test_per_episode_with_none_idle_a_process_is_started_for_the_episode_if_starts_work() -> None:
    table = _table((1, CLAIMED, 1, True), (2, STARTING, 0, True))
    placement = EpisodePlacement(2)
    assert placement.for_episode(table, can_spawn=True) == SPAWN
    assert placement.for_episode(table, can_spawn=False) is None
    assert placement.for_catalog(table) is None  # never an episode's process: the caller waits
    assert placement.serving(table, can_spawn=True) and not placement.serving(table, can_spawn=False)


def test_per_episode_keeps_its_size_of_idle_and_starting_processes() -> None:
    placement = EpisodePlacement(3)
    table = ProcessTable()
    rows = [(1, READY, False), (2, STARTING, False), (3, STARTING, True), (4, CLAIMED, False)]
    for worker_id, state, reserved in rows:
        process = worker_process(worker_id, reserved=reserved)
        table.add(process)
        if state is not STARTING:
            table.move(process, state)
    # Idle 1 and starting 2 count; 3 was started for an episode, 4 is claimed.
    assert placement.to_spawn(table) == 1


@pytest.mark.parametrize("value, count", [("1", 1), ("7", 7)])
def test_worker_count(value: str, count: int) -> None:
    assert worker_count(value) == count


def test_worker_count_auto_is_the_cpus_and_zero_is_refused() -> None:
    assert worker_count("auto") >= 1
    with pytest.raises(ValueError):
        worker_count("0")


def test_shared_a_stalled_process_gets_no_new_episode_while_it_is_stalled() -> None:
    table = _table((1, READY, 0, True), (2, READY, 7, True))
    idle_but_stalled = {1}
    placement = SharedPlacement(2)

    def stalled(process) -> bool:
        return process.worker_id in idle_but_stalled

    assert placement.for_episode(table, stalled=stalled).worker_id == 2  # the busier one, which answers
    assert placement.for_catalog(table, stalled=stalled).worker_id == 2
    idle_but_stalled.add(2)
    assert placement.for_episode(table, stalled=stalled) is None
    assert not placement.serving(table, can_spawn=True, stalled=stalled)
    assert placement.serving(table, can_spawn=True)  # up, and serving again once its loop runs
    idle_but_stalled.clear()
    assert placement.for_episode(table, stalled=stalled).worker_id == 1


def test_per_episode_a_stalled_idle_process_is_not_claimed() -> None:
    table = _table((1, READY, 0, True), (2, READY, 0, True))
    placement = EpisodePlacement(2)
    assert placement.for_episode(table, can_spawn=True, stalled=lambda p: p.worker_id == 1).worker_id == 2
    assert placement.for_episode(table, can_spawn=True, stalled=lambda p: True) == SPAWN
    assert placement.for_catalog(table, stalled=lambda p: True) is None
