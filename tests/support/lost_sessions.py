"""What the load-balancer tests (tests/deploy/) share to lose a backend: sessions open on every
backend of a topology serving tests/support/scaleout_env.py, and the prompt failure of a call on one."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

#: Bound on a call to a lost session: it must fail, not hang. (ors.client's
#: call_tool raises on a 404 at once; its other requests retry one twice, 1 s and 2 s apart.)
LOST_CALL_BOUND_S = 30.0


async def call_failure(coroutine) -> Exception:
    """The exception a call must raise promptly; fails the test if it hangs or succeeds."""
    try:
        await asyncio.wait_for(coroutine, LOST_CALL_BOUND_S)
    except asyncio.TimeoutError:
        pytest.fail(f"a call on a lost session hung for {LOST_CALL_BOUND_S} s")
    except Exception as exc:
        return exc
    pytest.fail("a call on a lost session succeeded")


async def open_sessions_on_every_backend(env, stack: contextlib.AsyncExitStack, victim_pid: int) -> list[tuple[object, int]]:
    """Open sessions (each answers once, telling its backend) until some are on
    the victim and some elsewhere; random ids spread fast, the bound is generous."""
    held: list[tuple[object, int]] = []
    for _ in range(100):
        session = await stack.enter_async_context(env.session(split="train", index=0))
        output = await session.call_tool("add", {"a": 1, "b": 1})
        held.append((session, output.metadata["pid"]))
        on_victim = sum(pid == victim_pid for _, pid in held)
        if on_victim >= 2 and len(held) - on_victim >= 2:
            break
    return held
