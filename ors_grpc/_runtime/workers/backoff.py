"""Crash-loop backoff: how long the pool waits before its next start while
processes keep failing young. Pure (the caller says what happened and when),
so it is tested without processes (`tests/workers/test_backoff.py`)."""

from __future__ import annotations

__all__ = ["CRASH_LOOP_FAILURES", "MAX_RESTART_BACKOFF_S", "RestartBackoff", "YOUNG_DEATH_S"]

#: A process that ends within this many seconds of starting died young: it counts as a failure.
YOUNG_DEATH_S = 10.0
#: The wait after the first failure in a row; it doubles with each further one, up to `MAX_RESTART_BACKOFF_S`.
FIRST_BACKOFF_S = 0.5
MAX_RESTART_BACKOFF_S = 30.0
#: Failures in a row that make a crash loop (logged once, as it begins).
CRASH_LOOP_FAILURES = 3


class RestartBackoff:
    """Failures in a row (failed starts, young deaths) and when the next start may come.

    `failed` and `ended` (a death, young or not) are told what happened and
    when; `proved` ends a run of failures. Which events prove a process
    healthy is the placement's call (`placement`): where processes serve
    many episodes, only one that outlived `YOUNG_DEATH_S`; where they end
    with their episode, a good start.
    """

    __slots__ = ("failures", "resume_at")

    def __init__(self) -> None:
        self.failures = 0
        #: No start before this time (the clock's), once a failure was told.
        self.resume_at = 0.0

    @property
    def failing(self) -> bool:
        """Whether the last start or death failed and nothing proved health since."""
        return self.failures > 0

    @property
    def delay_s(self) -> float:
        """The wait before the next start: 0, then 0.5 s doubling per failure in a row, at most 30 s."""
        if self.failures == 0:
            return 0.0
        return min(MAX_RESTART_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (self.failures - 1))

    def may_start(self, now: float) -> bool:
        return now >= self.resume_at

    def failed(self, now: float) -> bool:
        """A start failed, or a process died young, at `now`. True when this one begins a crash loop."""
        self.failures += 1
        self.resume_at = now + self.delay_s
        return self.failures == CRASH_LOOP_FAILURES

    def proved(self) -> None:
        """A process proved healthy: the run of failures is over."""
        self.failures = 0
        self.resume_at = 0.0

    def ended(self, lived_s: float, now: float) -> bool:
        """A process that had started ended at `now` after `lived_s`: a failure if young, else proof.
        True when this one begins a crash loop."""
        if lived_s < YOUNG_DEATH_S:
            return self.failed(now)
        self.proved()
        return False
