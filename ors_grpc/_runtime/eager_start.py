"""Start a coroutine at once, in the caller's turn of the loop, as Python
3.12's eager tasks do: most calls of a trivial step finish in their first
step, and then no task is made, scheduled or run for them. A coroutine that
waits goes on in a task from where it stopped. The first step runs in a
copy of the caller's context, and the task keeps that copy, so context
variables behave as in a task started the usual way."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, Coroutine, Optional

__all__ = ["start_eagerly"]


def start_eagerly(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> Optional[asyncio.Task[None]]:
    """Run `coro` up to its first wait; None if it finished there (what it raised propagates, as its
    result is dropped: give it a coroutine that handles its own errors), else the task it goes on in."""
    context = contextvars.copy_context()
    try:
        waiting_on = context.run(coro.send, None)
    except StopIteration:
        return None
    return loop.create_task(_resumed(coro, waiting_on), context=context)


async def _resumed(coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
    """The rest of `coro`, whose last step yielded `waiting_on` (the future it waits for; None for a bare
    yield, one turn of the loop): each outcome of the wait goes into it as its task would send it."""
    while True:
        try:
            if waiting_on is None:
                await asyncio.sleep(0)
            else:
                waiting_on._asyncio_future_blocking = False  # taken, as a task takes what a step yields
                await waiting_on
        except BaseException as exc:  # the wait failed, or this task was cancelled (which cancels the future)
            step, arg = coro.throw, exc
        else:
            step, arg = coro.send, None
        try:
            waiting_on = step(arg)
        except StopIteration:
            return
