"""Stand-ins for a worker process's connection, for the pool's pure parts: no process, no loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ors_grpc._runtime.workers.process_table import WorkerProcess


@dataclass
class FakeProcessHandle:
    pid: Optional[int] = 4242


@dataclass
class FakeConnection:
    """What the table, the placement and the watchdog read of a connection."""

    alive: bool = True
    episodes: int = 0
    killed_because: Optional[str] = None
    process: FakeProcessHandle = field(default_factory=FakeProcessHandle)


def worker_process(worker_id: int, *, episodes: int = 0, alive: bool = True, reserved: bool = False,
                   started_at: float = 0.0) -> WorkerProcess:
    return WorkerProcess(worker_id, FakeConnection(alive=alive, episodes=episodes),  # type: ignore[arg-type]
                         started_at, reserved=reserved)
