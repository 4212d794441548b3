"""In-process, environments' code shares the server's event loop: the loop
monitor (ors_grpc/_runtime/loop_monitor.py) logs one WARNING per stall over
a second, naming the environment and the function holding the loop, whether
it is sync code on the loop or an `async def` that blocks; quick code is
never reported. No timing is asserted beyond "a 2 s block is reported"; the held
time a worker reports tells one callback holding the loop from many quick ones, on
asyncio's loop and on uvloop."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable

import pytest
import uvloop

from ors_grpc import Environment, TextBlock, ToolOutput, tool
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._runtime.loop_monitor import STALL_WARNING_S, LoopMonitor, describe_user_code
from tests.support.grpc_calls import call_tool, create_episode, serving

BLOCK_S = 2.0
MONITOR = "ors_grpc.loop_monitor"


class _Tasks(Environment):
    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"id": 0}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="go")]


class SyncOnLoopEnv(_Tasks):
    """Sync code pinned to the loop, as the reference runs it."""

    sync_code_on_loop = True

    @tool
    def block(self) -> ToolOutput:
        """Sleeps on the loop."""
        time.sleep(BLOCK_S)
        return ToolOutput(blocks=[TextBlock(text="slept")], reward=0.0, finished=False)

    @tool
    def quick(self) -> ToolOutput:
        """Returns at once."""
        return ToolOutput(blocks=[TextBlock(text="quick")], reward=0.0, finished=False)


class AsyncBlockingEnv(_Tasks):
    """The common bug: a blocking call inside `async def`."""

    @tool
    async def block(self) -> ToolOutput:
        """Sleeps without awaiting."""
        await asyncio.sleep(0)
        time.sleep(BLOCK_S)
        return ToolOutput(blocks=[TextBlock(text="slept")], reward=0.0, finished=False)

    @tool
    async def quick(self) -> ToolOutput:
        """Awaits a little."""
        await asyncio.sleep(0.01)
        return ToolOutput(blocks=[TextBlock(text="quick")], reward=0.0, finished=False)


class BlockingPromptEnv(_Tasks):
    async def get_prompt(self) -> list[TextBlock]:
        time.sleep(BLOCK_S)
        return [TextBlock(text="late")]

    @tool
    def noop(self) -> ToolOutput:
        """Does nothing."""
        return ToolOutput(blocks=[TextBlock(text="ok")], reward=0.0, finished=False)


def _monitor_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == MONITOR and r.levelno == level]


async def _stall_ended(caplog: pytest.LogCaptureFixture) -> None:
    """Wait for the monitor's end-of-stall line (it follows its WARNING)."""
    while not _monitor_records(caplog, logging.INFO):
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("env_cls", [SyncOnLoopEnv, AsyncBlockingEnv], ids=["sync on the loop", "async def"])
async def test_a_tool_blocking_the_loop_is_reported_once_by_environment_and_tool(env_cls, caplog) -> None:
    caplog.set_level(logging.INFO, logger=MONITOR)
    async with serving([env_cls]) as stub:
        sid = await create_episode(stub, env_cls.__name__.lower())
        # Another episode's quick calls run around the stall: the block is still named.
        other = await create_episode(stub, env_cls.__name__.lower())
        slow = asyncio.ensure_future(call_tool(stub, sid, "block"))
        for _ in range(3):
            await call_tool(stub, other, "quick")
        _, event = await slow
        assert event.result.output.blocks[0].text.text == "slept"
        await asyncio.wait_for(_stall_ended(caplog), 30)
    warnings = _monitor_records(caplog, logging.WARNING)
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert f"environment={env_cls.__name__} function=block " in warnings[0].getMessage()


async def test_a_lifecycle_method_blocking_the_loop_is_named(caplog) -> None:
    caplog.set_level(logging.INFO, logger=MONITOR)
    async with serving([BlockingPromptEnv]) as stub:
        sid = await create_episode(stub, "blockingpromptenv")
        prompt = await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
        assert prompt.blocks[0].text.text == "late"
        await asyncio.wait_for(_stall_ended(caplog), 30)
    warnings = _monitor_records(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert "environment=BlockingPromptEnv function=get_prompt " in warnings[0].getMessage()


@pytest.mark.parametrize("env_cls", [SyncOnLoopEnv, AsyncBlockingEnv], ids=["sync on the loop", "async def"])
async def test_quick_tools_are_never_reported(env_cls, caplog) -> None:
    caplog.set_level(logging.INFO, logger=MONITOR)
    async with serving([env_cls]) as stub:
        sid = await create_episode(stub, env_cls.__name__.lower())
        for _ in range(50):
            await call_tool(stub, sid, "quick")
    assert _monitor_records(caplog, logging.WARNING) == []


def test_user_code_is_described_by_its_class_and_function() -> None:
    env = SyncOnLoopEnv({}, {})
    assert describe_user_code(env.block) == ("SyncOnLoopEnv", "block")
    assert describe_user_code(SyncOnLoopEnv.list_tasks) == ("SyncOnLoopEnv", "list_tasks")
    assert describe_user_code(SyncOnLoopEnv) == ("SyncOnLoopEnv", "__init__")


#: The event loops a monitor reads: the stdlib's, and uvloop's (the server's and its workers').
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def _held_while(loop_name: str, hold: Callable[[LoopMonitor, threading.Event], Any]) -> list[float]:
    """The monitor's `held_s()`, sampled off the loop while `hold(monitor, done)` runs on it (until `done`)."""
    samples: list[float] = []
    done = threading.Event()

    async def main() -> None:
        monitor = LoopMonitor(asyncio.get_running_loop())
        monitor.start()
        await asyncio.sleep(0.3)  # the first probes answered: the monitor knows the loop's thread

        def sample() -> None:
            while not done.wait(0.02):
                samples.append(monitor.held_s())

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            await hold(monitor, done)
        finally:
            done.set()
            sampler.join()
            monitor.stop()

    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        runner.run(main())
    return samples


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_one_callback_holding_the_loop_is_held_time(loop_name: str) -> None:
    seen: list[float] = []

    async def block(monitor: LoopMonitor, done: threading.Event) -> None:
        async def stuck() -> None:  # one step that blocks, until the monitor saw it hold the loop
            deadline = time.monotonic() + 20
            while monitor.held_s() <= STALL_WARNING_S and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(monitor.held_s())
        await asyncio.create_task(stuck())

    _held_while(loop_name, block)
    assert seen[0] > STALL_WARNING_S


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_a_busy_loop_of_quick_callbacks_is_no_held_time(loop_name: str) -> None:
    lags: list[float] = []

    async def busy(monitor: LoopMonitor, done: threading.Event) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(1000):  # one turn of the loop running 2 s of callbacks, 2 ms each
            loop.call_soon(time.sleep, 0.002)

        async def stepping() -> None:  # and tasks whose every step takes 2 ms
            for _ in range(300):
                time.sleep(0.002)
                await asyncio.sleep(0)

        await asyncio.gather(*(stepping() for _ in range(3)))
        lags.append(monitor.max_lag_s)

    held = _held_while(loop_name, busy)
    assert lags[0] > STALL_WARNING_S  # the probes waited: the loop was that busy
    assert max(held) < STALL_WARNING_S
