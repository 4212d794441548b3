"""start_eagerly: a coroutine runs at once up to its first wait; one that waits goes on in a task
that gives it each outcome of its waits as a task started the usual way would."""

from __future__ import annotations

import asyncio
import contextvars

import pytest
import uvloop

from ors_grpc._runtime.eager_start import start_eagerly

seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="outside")

LOOPS = [pytest.param(asyncio.new_event_loop, id="asyncio"), pytest.param(uvloop.new_event_loop, id="uvloop")]


def run(loop_factory, main) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_a_coroutine_that_does_not_wait_finishes_at_once_with_no_task(loop_factory) -> None:
    done = []

    async def step() -> None:
        seen.set("inside")
        done.append(seen.get())

    async def main() -> None:
        assert start_eagerly(asyncio.get_running_loop(), step()) is None
        assert done == ["inside"]
        assert seen.get() == "outside"  # it ran in a copy of the caller's context

    run(loop_factory, main)


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_a_coroutine_that_waits_goes_on_in_a_task_in_its_own_context(loop_factory) -> None:
    trail = []

    async def step(answer: asyncio.Future, failure: asyncio.Future) -> None:
        seen.set("inside")
        trail.append(("answer", await answer))
        await asyncio.sleep(0)  # a bare yield
        try:
            await failure
        except KeyError as exc:
            trail.append(("raised", exc.args[0]))
        trail.append(("context", seen.get()))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        answer, failure = loop.create_future(), loop.create_future()
        task = start_eagerly(loop, step(answer, failure))
        assert task is not None and trail == []
        answer.set_result(42)
        failure.set_exception(KeyError("lost"))
        await task
        assert trail == [("answer", 42), ("raised", "lost"), ("context", "inside")]
        assert seen.get() == "outside"

    run(loop_factory, main)


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_cancelling_the_task_cancels_what_the_coroutine_waits_for_and_raises_in_it(loop_factory) -> None:
    trail = []

    async def step(never: asyncio.Future) -> None:
        try:
            await never
        except asyncio.CancelledError:
            trail.append("cancelled")
            raise

    async def main() -> None:
        loop = asyncio.get_running_loop()
        never = loop.create_future()
        task = start_eagerly(loop, step(never))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert never.cancelled() and trail == ["cancelled"]

    run(loop_factory, main)
