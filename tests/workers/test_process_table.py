"""The process table on its own: the moves a worker process's state may make, and the views the
pool reads (by id, by state in the order entered)."""

from __future__ import annotations

import pytest

from ors_grpc._runtime.workers.process_table import MOVES, ProcessState, ProcessTable
from tests.workers._fakes import worker_process

STARTING, READY, CLAIMED = ProcessState.STARTING, ProcessState.READY, ProcessState.CLAIMED


def test_a_spawned_process_enters_starting_and_is_found_by_id() -> None:
    table = ProcessTable()
    process = worker_process(1)
    table.add(process)
    assert process.state is STARTING
    assert table.get(1) is process and process in table and len(table) == 1
    assert table.in_state(STARTING) == [process] and table.started() == []


def test_an_id_enters_once() -> None:
    table = ProcessTable()
    table.add(worker_process(1))
    with pytest.raises(ValueError):
        table.add(worker_process(1))


@pytest.mark.parametrize("path", [[READY], [CLAIMED], [READY, CLAIMED]])
def test_the_allowed_moves(path: list[ProcessState]) -> None:
    table = ProcessTable()
    process = worker_process(1)
    table.add(process)
    for state in path:
        table.move(process, state)
        assert process.state is state and table.in_state(state) == [process]
    assert table.started() == [process]
    assert sum(table.count(state) for state in ProcessState) == 1


@pytest.mark.parametrize("path", [[STARTING], [READY, READY], [READY, STARTING], [CLAIMED, READY], [CLAIMED, STARTING]])
def test_no_other_move(path: list[ProcessState]) -> None:
    table = ProcessTable()
    process = worker_process(1)
    table.add(process)
    for state in path[:-1]:
        table.move(process, state)
    before = process.state
    with pytest.raises(ValueError):
        table.move(process, path[-1])
    assert process.state is before and table.in_state(before) == [process]


def test_the_moves_table_is_the_one_documented() -> None:
    assert {state: set(targets) for state, targets in MOVES.items()} == {
        STARTING: {READY, CLAIMED}, READY: {CLAIMED}, CLAIMED: set(),
    }


def test_a_removed_process_is_gone_from_every_view_and_cannot_move() -> None:
    table = ProcessTable()
    process = worker_process(1)
    table.add(process)
    table.move(process, READY)
    table.remove(process)
    table.remove(process)  # reaped twice: nothing
    assert table.get(1) is None and process not in table and len(table) == 0
    assert table.in_state(READY) == [] and table.count(READY) == 0
    with pytest.raises(ValueError):
        table.move(process, CLAIMED)


def test_a_state_lists_its_processes_in_the_order_they_entered_it() -> None:
    table = ProcessTable()
    processes = [worker_process(i) for i in (1, 2, 3)]
    for process in processes:
        table.add(process)
    for process in reversed(processes):  # 3 is ready first
        table.move(process, READY)
    assert [p.worker_id for p in table.in_state(READY)] == [3, 2, 1]
    assert table.first(READY) is processes[2]
    table.move(processes[2], CLAIMED)
    assert table.first(READY) is processes[1]
    assert [p.worker_id for p in table] == [1, 2, 3]  # the table itself: in spawn order


def test_a_process_of_the_same_id_that_is_not_the_one_in_the_table_is_not_moved_or_removed() -> None:
    table = ProcessTable()
    table.add(worker_process(1))
    impostor = worker_process(1)
    with pytest.raises(ValueError):
        table.move(impostor, READY)
    table.remove(impostor)
    assert len(table) == 1
