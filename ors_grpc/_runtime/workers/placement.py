"""Placement: which worker process takes a new episode, which answers a
class-level call, and how many processes the pool keeps. Two policies, pure
functions of the process table and of which processes are stalled now (no
new episode goes to a process whose event loop is held: `watchdog.loop_stalled`)
(`tests/workers/test_placement.py`):
`SharedPlacement` (`--workers N`: N processes, each hosting many episodes)
and `EpisodePlacement` (`--isolation episode`: a process per episode, taken
from a few started ahead)."""

from __future__ import annotations

import os
from typing import Callable, Optional, Union

from ors_grpc._runtime.workers.process_table import ProcessState, ProcessTable, WorkerProcess

__all__ = ["SPAWN", "EpisodePlacement", "Placement", "SharedPlacement", "worker_count"]

#: `for_episode`'s answer when the episode should get a process started for it alone.
SPAWN = "spawn"


def worker_count(value: str) -> int:
    """`--workers` as a number: N, or `auto` (the CPUs this process may run on)."""
    if value == "auto":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    count = int(value)
    if count < 1:
        raise ValueError("--workers must be at least 1, or auto")
    return count


#: Which processes are stalled now (the pool asks its watchdog); by default none.
Stalled = Callable[[WorkerProcess], bool]


def _never(process: WorkerProcess) -> bool:
    return False


def _live(process: WorkerProcess) -> bool:
    return process.connection.alive


def _takes_work(process: WorkerProcess, stalled: Stalled) -> bool:
    """Live, and not stalled: a new episode or call sent there would wait behind the stall."""
    return process.connection.alive and not stalled(process)


class SharedPlacement:
    """`size` processes; a new episode goes to the least-loaded live one and
    lives there for its whole life; class-level calls go there too. Deaths
    count toward a crash loop; only a process that outlived its youth
    proves health (`backoff`)."""

    one_episode_per_process = False
    #: A good start proves nothing here: a process that then dies young still counts.
    start_proves_health = False

    def __init__(self, size: int) -> None:
        self.size = size

    def to_spawn(self, table: ProcessTable) -> int:
        """How many processes to start now (every one in the table counts, until it is reaped)."""
        return max(0, self.size - len(table))

    def for_episode(
        self, table: ProcessTable, *, can_spawn: bool = False, stalled: Stalled = _never
    ) -> Optional[WorkerProcess]:
        """The least-loaded live READY process that is not stalled; None when none is."""
        live = [process for process in table.in_state(ProcessState.READY) if _takes_work(process, stalled)]
        return min(live, key=lambda process: process.connection.episodes) if live else None

    def for_catalog(self, table: ProcessTable, *, stalled: Stalled = _never) -> Optional[WorkerProcess]:
        return self.for_episode(table, stalled=stalled)

    def serving(self, table: ProcessTable, *, can_spawn: bool, stalled: Stalled = _never) -> bool:
        """Whether a new episode would find a process now (health SERVING)."""
        return any(_takes_work(process, stalled) for process in table.in_state(ProcessState.READY))


class EpisodePlacement:
    """A process per episode, which ends with it: a new episode claims the
    oldest idle (READY) one, else, when none is left, one started for it
    alone (its calls wait for the start). `size` idle processes are kept
    started or starting. Class-level calls go to an idle process (it stays
    idle), never to an episode's, which may end with its episode while the
    call runs. Processes end with their episodes, so a death proves nothing
    either way; a good start proves health."""

    one_episode_per_process = True
    start_proves_health = True

    def __init__(self, size: int) -> None:
        self.size = size

    def to_spawn(self, table: ProcessTable) -> int:
        """How many to start now: the idle and starting ones (not spawned for an episode) count."""
        starting = sum(1 for process in table.in_state(ProcessState.STARTING) if not process.reserved)
        return max(0, self.size - table.count(ProcessState.READY) - starting)

    def _idle(self, table: ProcessTable, stalled: Stalled) -> Optional[WorkerProcess]:
        return next((process for process in table.in_state(ProcessState.READY) if _takes_work(process, stalled)),
                    None)

    def for_episode(
        self, table: ProcessTable, *, can_spawn: bool, stalled: Stalled = _never
    ) -> Union[WorkerProcess, str, None]:
        """The oldest live idle process that is not stalled (the caller claims
        it); else SPAWN when a process can start (`can_spawn`: a template to
        fork from, not in a crash loop); else None."""
        idle = self._idle(table, stalled)
        if idle is not None:
            return idle
        return SPAWN if can_spawn else None

    def for_catalog(self, table: ProcessTable, *, stalled: Stalled = _never) -> Optional[WorkerProcess]:
        """An idle process; None while there is none (the caller waits for the pool to refill)."""
        return self._idle(table, stalled)

    def serving(self, table: ProcessTable, *, can_spawn: bool, stalled: Stalled = _never) -> bool:
        """An idle process to take, or starts that work."""
        return self._idle(table, stalled) is not None or can_spawn


Placement = Union[SharedPlacement, EpisodePlacement]
