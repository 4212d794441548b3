"""The server's own counters for its live view (GetServerStats), per environment.

Prometheus metrics (`observability.metrics`) are per process and made for a
scraper; these are per server (a process may run several) and answer at
once: tool calls per second and their latency over the last `WINDOW_S`
seconds, calls in flight, and the last few errors of the environment's code
(failed setups, tools that raised or timed out), with their messages as the
clients got them (secrets masked). Open sessions and prepared episodes are
not counted here: the session table and the warm pool know them.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

__all__ = ["EnvironmentCounters", "RecentError", "ServerStats", "WINDOW_S"]

#: Seconds the rates and latencies look back.
WINDOW_S = 60.0
#: Latest call durations kept per environment, for the percentiles.
LATENCY_SAMPLES = 2048
#: Latest errors kept per environment.
RECENT_ERRORS = 10


@dataclass(frozen=True)
class RecentError:
    """One error of an environment's code."""

    time_unix_ms: int
    source: str
    message: str


def _nearest_rank(sorted_values: list[float], quantile: float) -> float:
    return sorted_values[max(math.ceil(quantile * len(sorted_values)) - 1, 0)]


class EnvironmentCounters:
    """The counters of one environment."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = clock()
        #: (monotonic end time, seconds) of the latest calls.
        self._durations: deque[tuple[float, float]] = deque(maxlen=LATENCY_SAMPLES)
        #: [whole second, calls that ended in it], oldest first, at most WINDOW_S of them.
        self._per_second: deque[list[int]] = deque()
        self._errors: deque[RecentError] = deque(maxlen=RECENT_ERRORS)
        self.in_flight = 0

    def call_started(self) -> float:
        """A tool call starts: counted in flight; returns its start, for `call_ended`."""
        self.in_flight += 1
        return self._clock()

    def call_ended(self, name: str, started: float, failure: str | None) -> None:
        """The call of tool `name` that started at `started` ended: its
        duration counted, and its failure (the message, or None) as an error."""
        self.in_flight -= 1
        self._ended(started)
        if failure is not None:
            self.error(f"tool {name}", failure)

    def call_stopped(self) -> None:
        """A started call was cancelled (its session ended): out of flight, not counted."""
        self.in_flight -= 1

    def error(self, source: str, message: str) -> None:
        """Keep an error (a bounded few, the oldest dropped)."""
        self._errors.append(RecentError(int(time.time() * 1000), source, message))

    def _ended(self, started: float) -> None:
        now = self._clock()
        self._durations.append((now, now - started))
        second = int(now)
        if self._per_second and self._per_second[-1][0] == second:
            self._per_second[-1][1] += 1
        else:
            self._per_second.append([second, 1])
            while self._per_second[0][0] <= second - WINDOW_S:
                self._per_second.popleft()

    def calls_per_second(self) -> float:
        """Calls that ended within the window, per second of it (of the uptime while it is shorter)."""
        now = self._clock()
        ended = sum(count for second, count in self._per_second if second > now - WINDOW_S)
        return ended / max(min(WINDOW_S, now - self._started), 1.0)

    def latency_ms(self, *quantiles: float) -> list[float] | None:
        """The given quantiles (nearest rank) of the durations of the calls
        that ended within the window, in milliseconds; None if none did."""
        since = self._clock() - WINDOW_S
        recent = sorted(seconds for ended, seconds in self._durations if ended > since)
        if not recent:
            return None
        return [_nearest_rank(recent, quantile) * 1000 for quantile in quantiles]

    def recent_errors(self) -> list[RecentError]:
        """The kept errors, newest first."""
        return list(reversed(self._errors))


class ServerStats:
    """The counters of every environment of one server, by environment class."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._counters: dict[type, EnvironmentCounters] = {}

    def of(self, env_cls: type) -> EnvironmentCounters:
        counters = self._counters.get(env_cls)
        if counters is None:
            counters = self._counters[env_cls] = EnvironmentCounters(self._clock)
        return counters
