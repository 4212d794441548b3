"""Draining: a server about to stop (a rolling deploy) takes no new episode
but serves the ones it holds until each ends, or until its drain timeout.

`Drain.begin` (SIGTERM in `ors-grpc serve`, or the Drain RPC) turns every
grpc.health.v1 service name NOT_SERVING, so that Kubernetes and proxies
with health checks stop sending it new work; refuses new episodes and new
session ids with ERROR_REASON_DRAINING (UNAVAILABLE, retryable under a new
session id on another backend), but for an episode under an id it issued
moments before (`issued_ids`: a proxy may route that id nowhere else); and
ends the prepared episodes nobody can claim now.
`until_done` then waits for the session table to empty, and then for the
doors to go quiet (`DRAIN_QUIET_S`): a call that reaches a gRPC server as it
stops is answered CANCELLED, which no client retries, so the server stops
once the proxies that health-check it have stopped sending it work.
Stopping the server afterwards is the composition root's (`ors_grpc.serving`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ors_grpc._runtime.sessions import SessionTable

__all__ = ["DRAIN_QUIET_S", "DRAIN_SETTLE_MAX_S", "Drain"]

logger = logging.getLogger("ors_grpc.drain")

#: Once its last episode ended, a drained server stops when no ORS call has
#: arrived for this long (a creation under an id it issued may still come)...
DRAIN_QUIET_S = 1.0
#: ...or this long after its last episode ended, whatever still arrives (a
#: proxy without health checks keeps sending creations until the server exits).
DRAIN_SETTLE_MAX_S = 5.0


class Drain:
    """The drain of one server: not begun, then begun (for good)."""

    def __init__(self, sessions: SessionTable, health_servicer: Any, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._sessions = sessions
        self._health = health_servicer
        #: Set when the drain begins, by whichever trigger came first.
        self.begun = asyncio.Event()
        self._deadline: float | None = None
        #: How its operator stops the server at once instead, for the log line
        #: that starts the drain (set by whoever handles the process's signals).
        self.stop_at_once_hint: str | None = None
        #: When the last ORS call arrived (time.monotonic(); the service stamps every call).
        self.last_call_at = 0.0

    async def begin(self) -> None:
        """Start draining; a no-op once begun."""
        if self.begun.is_set():
            return
        self._deadline = asyncio.get_running_loop().time() + self.timeout_s
        self.begun.set()
        hint = f' stop_at_once="{self.stop_at_once_hint}"' if self.stop_at_once_hint else ""
        logger.info("drain_started open_sessions=%d timeout_s=%g%s", self._sessions.open_count, self.timeout_s, hint)
        await self._health.enter_graceful_shutdown()
        await self._sessions.start_draining()

    @property
    def open_sessions(self) -> int:
        return self._sessions.open_count

    @property
    def seconds_left(self) -> float:
        """Seconds until the drain timeout (the whole timeout before it began)."""
        if self._deadline is None:
            return self.timeout_s
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    async def until_done(self) -> bool:
        """Waits until every episode has ended and the doors are quiet (True), or the drain timeout
        passed (False)."""
        try:
            await asyncio.wait_for(self._ended_and_quiet(), self.seconds_left)
        except asyncio.TimeoutError:
            logger.warning("drain_timed_out open_sessions=%d", self._sessions.open_count)
            return False
        logger.info("drain_finished")
        return True

    async def _ended_and_quiet(self) -> None:
        """Every episode ended, then no call came for DRAIN_QUIET_S (at most DRAIN_SETTLE_MAX_S), with no
        episode created meanwhile (under an id this server issued before its drain)."""
        while True:
            await self._sessions.until_empty()
            settled_by = time.monotonic() + DRAIN_SETTLE_MAX_S
            while not self._sessions.open_count:
                wait_s = min(self.last_call_at + DRAIN_QUIET_S, settled_by) - time.monotonic()
                if wait_s <= 0:
                    return
                await asyncio.sleep(wait_s)
