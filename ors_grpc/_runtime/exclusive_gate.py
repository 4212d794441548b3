"""A session's exclusive gate: a readers-writer gate for its tool calls.

Calls to plain and concurrent tools pass it shared, many at a time; a call
to an exclusive or terminal tool passes it alone: it waits until every
shared call has left, and while it waits or runs no new call enters. It is
writer-preferring: once an exclusive call queues, later shared calls wait
behind it, so a steady stream of concurrent calls cannot starve it.
Exclusive calls enter one at a time, in arrival order.

Only sessions with an exclusive tool have a gate (see `tool_calls`): plain
sessions pay nothing for it. A tool that calls another tool of its session
from inside its body would deadlock behind a queued exclusive call; tools do
not do that.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import AsyncIterator

__all__ = ["ExclusiveGate"]


class ExclusiveGate:
    """Shared passage for most calls, sole passage for exclusive ones."""

    def __init__(self) -> None:
        self._shared = 0
        self._exclusive = False
        self._queued_exclusive: deque[asyncio.Future[None]] = deque()
        self._held_shared: list[asyncio.Future[None]] = []

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        """Pass with others; waits while an exclusive call runs or queues."""
        while self._exclusive or self._queued_exclusive:
            waiter = asyncio.get_running_loop().create_future()
            self._held_shared.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._held_shared:
                    self._held_shared.remove(waiter)
                raise
        self._shared += 1
        try:
            yield
        finally:
            self._shared -= 1
            self._admit()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Pass alone, once every call inside has left."""
        if self._exclusive or self._shared or self._queued_exclusive:
            waiter = asyncio.get_running_loop().create_future()
            self._queued_exclusive.append(waiter)
            try:
                await waiter  # `_admit` hands the gate over: `_exclusive` is set for us
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._exclusive = False  # handed over, then cancelled: give it back
                elif waiter in self._queued_exclusive:
                    self._queued_exclusive.remove(waiter)
                self._admit()  # this call may have been what held others back
                raise
        else:
            self._exclusive = True
        try:
            yield
        finally:
            self._exclusive = False
            self._admit()

    def _admit(self) -> None:
        """Let in whoever may enter now: the first queued exclusive call once
        the gate is empty, else (none queued) every held shared call."""
        if self._exclusive:
            return
        while self._queued_exclusive and self._queued_exclusive[0].done():
            self._queued_exclusive.popleft()  # cancelled, its task not yet told
        if self._queued_exclusive:
            if self._shared == 0:
                self._exclusive = True
                self._queued_exclusive.popleft().set_result(None)
            return
        held, self._held_shared = self._held_shared, []
        for waiter in held:
            if not waiter.done():
                waiter.set_result(None)
