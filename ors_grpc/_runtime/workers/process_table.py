"""The one table of worker processes the pool supervises, and each one's
state. A process is STARTING until its handshake is done, then READY (it
takes episodes as the placement says) or, with a process per episode,
CLAIMED by its episode once taken; it leaves the table when the pool reaps
it. Only `ProcessTable.move` changes a state, and only along `MOVES`."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Iterator, Optional

if TYPE_CHECKING:
    from ors_grpc._runtime.workers.connection import WorkerConnection

__all__ = ["MOVES", "ProcessState", "ProcessTable", "WorkerProcess"]


class ProcessState(enum.Enum):
    #: Spawned; its handshake (hello, setup, ready) is not done.
    STARTING = "starting"
    #: Started: it takes new episodes (many, or one to be claimed, as the placement says).
    READY = "ready"
    #: Taken by its one episode (a process per episode): it takes no other.
    CLAIMED = "claimed"


#: The moves between states; leaving the table (`remove`) is possible from any.
MOVES = {
    ProcessState.STARTING: frozenset({ProcessState.READY, ProcessState.CLAIMED}),
    ProcessState.READY: frozenset({ProcessState.CLAIMED}),
    ProcessState.CLAIMED: frozenset(),
}


class WorkerProcess:
    """One worker process as the pool sees it: its state, its connection
    (the hop to it), and what its heartbeats last said."""

    __slots__ = ("worker_id", "connection", "started_at", "state", "reserved", "heard_at", "lag_s", "held_s",
                 "heartbeats", "greeted")

    def __init__(self, worker_id: int, connection: WorkerConnection, started_at: float, *,
                 reserved: bool = False) -> None:
        self.worker_id = worker_id
        self.connection = connection
        self.started_at = started_at
        self.state = ProcessState.STARTING
        #: Spawned for one episode (the pool had no idle process): CLAIMED once started.
        self.reserved = reserved
        #: Whether its hello came (a second one with its id is refused).
        self.greeted = False
        #: When its last heartbeat came (the clock's; from its handshake until the first), and what it said.
        self.heard_at: Optional[float] = None
        self.lag_s = self.held_s = 0.0
        #: Its heartbeat connection's writer, once it opened one.
        self.heartbeats: Any = None

    @property
    def pid(self) -> Optional[int]:
        return self.connection.process.pid

    def __repr__(self) -> str:
        return f"<WorkerProcess {self.worker_id} {self.state.value}>"


class ProcessTable:
    """Every worker process from its spawn until it is reaped, by id, and by state."""

    def __init__(self) -> None:
        self._by_id: dict[int, WorkerProcess] = {}
        # Per state, in the order the processes entered it (the oldest idle one first).
        self._by_state: dict[ProcessState, dict[int, WorkerProcess]] = {state: {} for state in ProcessState}

    def add(self, process: WorkerProcess) -> None:
        """A spawned process (STARTING)."""
        if process.worker_id in self._by_id:
            raise ValueError(f"worker {process.worker_id} is already in the table")
        if process.state is not ProcessState.STARTING:
            raise ValueError(f"a process enters the table STARTING, not {process.state.name}")
        self._by_id[process.worker_id] = process
        self._by_state[ProcessState.STARTING][process.worker_id] = process

    def move(self, process: WorkerProcess, state: ProcessState) -> None:
        """Move `process` to `state` (ValueError for a move not in `MOVES`, or a process not in the table)."""
        if self._by_id.get(process.worker_id) is not process:
            raise ValueError(f"worker {process.worker_id} is not in the table")
        if state not in MOVES[process.state]:
            raise ValueError(f"worker {process.worker_id} cannot move from {process.state.name} to {state.name}")
        del self._by_state[process.state][process.worker_id]
        process.state = state
        self._by_state[state][process.worker_id] = process

    def remove(self, process: WorkerProcess) -> None:
        """The process was reaped (or never started); nothing if it was already."""
        if self._by_id.get(process.worker_id) is process:
            del self._by_id[process.worker_id]
            del self._by_state[process.state][process.worker_id]

    def get(self, worker_id: int) -> Optional[WorkerProcess]:
        return self._by_id.get(worker_id)

    def __contains__(self, process: WorkerProcess) -> bool:
        return self._by_id.get(process.worker_id) is process

    def __iter__(self) -> Iterator[WorkerProcess]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)

    def in_state(self, state: ProcessState) -> list[WorkerProcess]:
        """The processes in `state`, in the order they entered it."""
        return list(self._by_state[state].values())

    def count(self, state: ProcessState) -> int:
        return len(self._by_state[state])

    def first(self, state: ProcessState) -> Optional[WorkerProcess]:
        """The process that entered `state` first, if any."""
        return next(iter(self._by_state[state].values()), None)

    def started(self) -> list[WorkerProcess]:
        """The processes whose handshake is done (READY or CLAIMED)."""
        return [*self._by_state[ProcessState.READY].values(), *self._by_state[ProcessState.CLAIMED].values()]
