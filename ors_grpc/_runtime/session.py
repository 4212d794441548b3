"""One episode's entry in the session table: its host (the environment and
where its life stands, `environment_host`), its tool calls, its record."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ors_grpc._runtime.environment_host import EpisodeHost

if TYPE_CHECKING:
    from ors_grpc._runtime.episode_record import EpisodeRecorder
    from ors_grpc._runtime.tool_calls import SessionToolCalls

__all__ = ["Session"]


#: What every session's `constructed` and `ready` become once set: an asyncio.Event costs about
#: 0.8 KiB (its waiter deque), a lot next to the rest of an idle session.
_READY = asyncio.Event()
_READY.set()


class Session:
    """One episode: its host, its tool calls, its record."""

    # Slots: an idle episode's memory counts (thousands per server); tracing refers to it weakly.
    __slots__ = ("sid", "host", "calls", "redact", "constructed", "ready", "record", "setup_task", "last_active",
                 "route_key", "__weakref__")

    def __init__(
        self, sid: str, host: EpisodeHost, *, calls: SessionToolCalls, redact: Any, record: EpisodeRecorder,
    ) -> None:
        self.sid = sid
        #: The episode's environment, and where its life stands (`host.state`).
        self.host = host
        self.calls = calls
        self.redact = redact
        #: Set once the constructors have run (the creation answers then):
        #: wakes the creation; the host's state says how they went.
        self.constructed = asyncio.Event()
        #: Set once setup has ended, well or not, or the episode ended: wakes
        #: the calls waiting for it.
        self.ready = asyncio.Event()
        #: What happened in the episode (GetEpisodeRecord).
        self.record = record
        self.setup_task: asyncio.Task[None] | None = None
        self.last_active = time.monotonic()
        #: The `x-session-id` of the RunEpisode stream that created the
        #: episode, when it is not the episode's own id (a reused stream):
        #: the key its per-step RPCs are routed by.
        self.route_key: str | None = None

    @property
    def env_cls(self) -> Any:
        return self.host.env_cls

    def mark_constructed(self) -> None:
        """Wake the creation waiting for the constructors; later waits return at once."""
        self.constructed.set()
        self.constructed = _READY

    def mark_ready(self) -> None:
        """Wake every waiter for setup; later waits return at once."""
        self.ready.set()
        self.ready = _READY

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def idle_for(self, now: float) -> float:
        return now - max(self.last_active, self.calls.last_completed)
