"""One episode's state in the session table: its environment (once set up),
its tool calls and its construction's and setup's progress."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ors_grpc.authoring.environment import Environment
from ors_grpc.protocol.errors import ORSError

if TYPE_CHECKING:
    from ors_grpc._runtime.episode_record import EpisodeRecorder
    from ors_grpc._runtime.tool_calls import SessionToolCalls

__all__ = ["Session"]


#: What every session's `constructed` and `ready` become once set: an asyncio.Event costs about
#: 0.8 KiB (its waiter deque), a lot next to the rest of an idle session.
_READY = asyncio.Event()
_READY.set()


class Session:
    """One episode: its environment (once set up) and its tool calls."""

    def __init__(
        self, sid: str, env_cls: type[Environment], *, sync_lock: asyncio.Lock,
        calls: SessionToolCalls, redact: Any, record: EpisodeRecorder,
    ) -> None:
        self.sid = sid
        #: Keeps the episode's synchronous user code to one thread at a time.
        self.sync_lock = sync_lock
        self.env_cls = env_cls
        self.env: Environment | None = None
        self.calls = calls
        self.redact = redact
        #: Set once the constructors (the environment's, its session
        #: toolset's) have run: the creation answers then.
        self.constructed = asyncio.Event()
        #: Why a constructor failed (the creation fails with it).
        self.construction_error: ORSError | None = None
        #: What happened in the episode (GetEpisodeRecord).
        self.record = record
        self.ready = asyncio.Event()
        self.error: ORSError | None = None
        self.deleted = False
        self.setup_task: asyncio.Task[None] | None = None
        # True while setup runs synchronous user code in a worker thread,
        # which cannot be interrupted (see SessionTable.delete).
        self.setup_in_thread = False
        self.setup_abandoned = False
        self.last_active = time.monotonic()
        #: The `x-session-id` of the RunEpisode stream that created the
        #: episode, when it is not the episode's own id (a reused stream):
        #: the key its per-step RPCs are routed by.
        self.route_key: str | None = None

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
