"""In-process, environments' code shares the server's event loop: the loop
monitor (ors_grpc/_runtime/loop_monitor.py) logs one WARNING per stall over
a second, naming the environment and the function holding the loop, whether
it is sync code on the loop or an `async def` that blocks; quick code is
never reported. No timing is asserted beyond "a 2 s block is reported"."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from ors_grpc import Environment, TextBlock, ToolOutput, tool
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._runtime.loop_monitor import describe_user_code
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
