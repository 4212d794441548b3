"""The watchdog: which started worker processes to kill, looked at once a
period. Over the memory limit, or stalled: one callback has held its event
loop, or it has sent no heartbeat, past the stall limit. The verdicts are
pure functions of what the heartbeats and /proc said; docs/workers.md says
why load never trips the stall verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from ors_grpc._runtime.loop_monitor import STALL_WARNING_S
from ors_grpc.protocol.errors import CRASH_CAUSE_MEMORY_LIMIT, CRASH_CAUSE_STALLED

if TYPE_CHECKING:
    from ors_grpc._runtime.workers.process_table import WorkerProcess

__all__ = [
    "DEFAULT_STALL_LIMIT_S", "HEARTBEAT_INTERVAL_S", "Kill", "Watchdog", "heartbeat_interval_s", "loop_stalled",
    "rss_bytes", "stall_verdict",
]

#: Seconds one callback may hold a worker's event loop, or the worker stay silent, before it is
#: killed (`--worker-stall-limit`; 0: never). Far above what load makes: docs/workers.md.
DEFAULT_STALL_LIMIT_S = 60.0
#: Seconds between a worker's heartbeats (at most a quarter of the stall limit).
HEARTBEAT_INTERVAL_S = 1.0
#: Seconds between two readings of the workers' memory (with a memory limit).
MEMORY_POLL_S = 1.0
#: The stall verdicts: one callback held the loop too long; no heartbeat came for too long.
HELD, SILENT = "event_loop_held", "no_heartbeat"


def heartbeat_interval_s(stall_limit_s: float) -> float:
    """How often workers report, for a stall limit (0: no limit, no heartbeats)."""
    return min(HEARTBEAT_INTERVAL_S, stall_limit_s / 4)


def loop_stalled(held_s: float, heartbeat_s: float) -> bool:
    """Whether a worker's event loop is stalled now, so that it takes no new
    episode: its last heartbeat said one callback has held it longer than
    two heartbeat periods (and than `STALL_WARNING_S`, where the worker warns
    of it). Long before the kill (`stall_verdict`), and above what load makes
    (docs/workers.md). Silence does not count here: heartbeats read late by a
    busy server would look like it. With no heartbeats (no stall limit), never."""
    return bool(heartbeat_s) and held_s > max(STALL_WARNING_S, 2 * heartbeat_s)


def stall_verdict(held_s: float, silent_s: float, limit_s: float) -> Optional[str]:
    """Why a worker is stalled (HELD, SILENT), or None. `held_s`: how long the
    one callback running on its loop has run (its last heartbeat's); `silent_s`:
    since its last heartbeat. A limit of 0 is no limit."""
    if not limit_s:
        return None
    if held_s > limit_s:
        return HELD
    if silent_s > limit_s:
        return SILENT
    return None


@dataclass(frozen=True)
class Kill:
    """A verdict: kill `process`, telling its episodes `cause` (a CRASH_CAUSE_*); `why` is for the log."""

    process: WorkerProcess
    cause: str
    why: str


class Watchdog:
    """Looks at the started processes every `period_s` (the pool's loop calls `look`)."""

    def __init__(
        self, *, stall_limit_s: float, memory_limit_bytes: Optional[float],
        rss: Callable[[int], Optional[int]] | None = None,
    ) -> None:
        self.stall_limit_s = stall_limit_s
        self.memory_limit_bytes = memory_limit_bytes
        self._rss = rss or rss_bytes
        self._heartbeat_s = heartbeat_interval_s(stall_limit_s) if stall_limit_s else 0.0
        self._stalls_due = self._memory_due = self._stalls_looked = None  # type: Optional[float]

    def next_due(self, now: float) -> Optional[float]:
        """When `look` next has something to do (None: never)."""
        dues = []
        if self._heartbeat_s:
            dues.append(self._stalls_due if self._stalls_due is not None else now + self._heartbeat_s)
        if self.memory_limit_bytes is not None:
            dues.append(self._memory_due if self._memory_due is not None else now + MEMORY_POLL_S)
        return min(dues) if dues else None

    def stalled(self, process: WorkerProcess) -> bool:
        """Whether `process`'s loop is stalled now, by its last heartbeat (`loop_stalled`)."""
        return loop_stalled(process.held_s, self._heartbeat_s)

    def look(self, now: float, processes: Iterable[WorkerProcess]) -> list[Kill]:
        """The kills due now among `processes` (the started ones)."""
        processes = list(processes)
        kills: list[Kill] = []
        if self._heartbeat_s:
            if self._stalls_due is None:
                self._stalls_due, self._stalls_looked = now + self._heartbeat_s, now
            elif now >= self._stalls_due:
                kills += self._stalls(now, processes)
                self._stalls_due = now + self._heartbeat_s
        if self.memory_limit_bytes is not None:
            if self._memory_due is None:
                self._memory_due = now + MEMORY_POLL_S
            elif now >= self._memory_due:
                doomed = {kill.process for kill in kills}
                kills += self._over_memory(p for p in processes if p not in doomed)
                self._memory_due = now + MEMORY_POLL_S
        return kills

    def _stalls(self, now: float, processes: list[WorkerProcess]) -> list[Kill]:
        period = self._heartbeat_s
        if self._stalls_looked is not None and now - self._stalls_looked > 2 * period:
            # This server's own loop was held: heartbeats may wait unread. Silence counts afresh.
            for process in processes:
                if process.heard_at is not None:
                    process.heard_at = max(process.heard_at, now - period)
        self._stalls_looked = now
        kills = []
        for process in processes:
            connection = process.connection
            if not connection.alive or connection.killed_because is not None or process.heard_at is None:
                continue
            silent_s = now - process.heard_at
            verdict = stall_verdict(process.held_s, silent_s, self.stall_limit_s)
            if verdict is not None:
                kills.append(Kill(process, CRASH_CAUSE_STALLED, (
                    f"worker={process.worker_id} pid={process.pid} reason={verdict} held_s={process.held_s:.1f} "
                    f"lag_s={process.lag_s:.1f} silent_s={silent_s:.1f} stall_limit_s={self.stall_limit_s:g} "
                    f"episodes={connection.episodes}")))
        return kills

    def _over_memory(self, processes: Iterable[WorkerProcess]) -> list[Kill]:
        """Kill a worker whose RSS passed the limit, before the machine's OOM killer picks the server."""
        assert self.memory_limit_bytes is not None
        kills = []
        for process in processes:
            rss = self._rss(process.pid) if process.pid is not None else None
            if process.connection.alive and rss is not None and rss > self.memory_limit_bytes:
                kills.append(Kill(process, CRASH_CAUSE_MEMORY_LIMIT, (
                    f"worker={process.worker_id} reason=memory_limit rss_mib={rss / 2**20:.0f} "
                    f"limit_mib={self.memory_limit_bytes / 2**20:.0f} episodes={process.connection.episodes}")))
        return kills


def rss_bytes(pid: int) -> Optional[int]:
    """A process's resident memory (VmRSS), None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None
