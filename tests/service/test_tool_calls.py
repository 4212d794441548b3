"""CallTool: results, errors, lossless JSON, big payloads, attach by task id, episode invariants."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import grpc
import pytest
from pydantic import BaseModel

from ors_grpc import TextBlock, ToolOutput, tool
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc.server import ServerConfig
from ors_grpc._runtime.tool_calls import EPISODE_FINISHED
from tests.support.grpc_calls import call_tool, create_episode, error_reason, expect_error, serving, tool_call
from tests.support.environments import EchoEnv, image_bytes

WAIT_S = 10.0


def exact(value: Any) -> str:
    """JSON text that tells 1 from 1.0 and keeps key order, for comparisons."""
    return json.dumps(value, ensure_ascii=False)


class RawInput(BaseModel):
    value: Any


class CountingEnv(EchoEnv):
    """Tools that count their runs; `gated` waits for the test to open `gate`."""

    runs: dict[str, int]
    active = 0
    max_active = 0
    cancelled = False
    started: asyncio.Event
    gate: asyncio.Event
    sync_started = threading.Event()
    sync_release = threading.Event()

    @classmethod
    def reset(cls) -> None:
        cls.runs, cls.active, cls.max_active, cls.cancelled = {}, 0, 0, False
        cls.started, cls.gate = asyncio.Event(), asyncio.Event()
        cls.sync_started.clear()
        cls.sync_release.clear()

    @classmethod
    def count_run(cls, name: str) -> None:
        cls.runs[name] = cls.runs.get(name, 0) + 1

    @tool
    async def gated(self) -> ToolOutput:
        """Runs until the test opens the gate."""
        cls = type(self)
        cls.count_run("gated")
        cls.active += 1
        cls.max_active = max(cls.max_active, cls.active)
        cls.started.set()
        try:
            await cls.gate.wait()
        except asyncio.CancelledError:
            cls.cancelled = True
            raise
        finally:
            cls.active -= 1
        return ToolOutput(blocks=[TextBlock(text="gated done")], reward=0.5)

    @tool
    def sync_gated(self) -> ToolOutput:
        """A synchronous tool blocking its thread until released."""
        type(self).sync_started.set()
        type(self).sync_release.wait(WAIT_S)
        return ToolOutput(blocks=[TextBlock(text="sync done")])

    @tool
    def count(self) -> ToolOutput:
        """Counts its runs."""
        type(self).count_run("count")
        return ToolOutput(blocks=[TextBlock(text="counted")])

    @tool
    def spec(self) -> ToolOutput:
        """The task spec, as metadata."""
        return ToolOutput(blocks=[], metadata=self.task_spec)

    @tool
    def raw(self, params: RawInput) -> ToolOutput:
        """The input value, as metadata."""
        return ToolOutput(blocks=[], metadata={"value": params.value})


LOSSLESS = {
    "z_first": 1, "big": 2**70, "negative_big": -(2**64) - 1, "float_one": 1.0, "int_one": 1,
    "pi": 3.141592653589793, "tiny": 1e-300, "unicode": "ünïcödé ✓ 😀 \u2028", "null": None,
    "nested": {"b": [1, 2.0, {"y": True, "x": False}], "a": {}}, "a_last": [],
}


@pytest.fixture
async def stub():
    CountingEnv.reset()
    async with serving([CountingEnv]) as stub:
        yield stub


async def test_tool_results_and_tool_level_errors(stub) -> None:
    sid = await create_episode(stub, "countingenv")
    task_id, event = await call_tool(stub, sid, "echo", {"text": "hi"})
    assert len(task_id) == 32 and int(task_id, 16) >= 0
    output = event.result.output
    assert output.blocks[0].text.text == "hi" and not output.HasField("reward") and not output.finished
    _, event = await call_tool(stub, sid, "add", {"a": 2, "b": 40})
    assert event.result.output.HasField("reward") and event.result.output.reward == 0.0
    _, event = await call_tool(stub, sid, "nope", {})
    assert event.result.error == "'nope' is not a valid tool"
    _, event = await call_tool(stub, sid, "add", {"a": "x"})
    # The reference's words first, then one line per wrong field, what was sent quoted back.
    assert event.result.error == ("Tool input validation error:\n"
                                  "a: Input should be a valid integer, unable to parse string as an integer (got 'x')\n"
                                  "b: Field required")
    assert event.result.reason == types_pb2.RUN_TOOL_ERROR_REASON_INPUT_VALIDATION
    _, event = await call_tool(stub, sid, "add", {"a": 1, "b": [1, 2]})
    assert event.result.error == "Tool input validation error: b: Input should be a valid integer (got [1, 2])"
    _, event = await call_tool(stub, sid, "count")  # no input at all means {}
    assert event.result.output.blocks[0].text.text == "counted"


async def test_tool_that_raises_is_a_failure_and_the_session_lives_on(stub) -> None:
    sid = await create_episode(stub, "countingenv")
    _, event = await call_tool(stub, sid, "fail")
    assert event.WhichOneof("event") == "failure" and event.failure.message == "boom"
    _, event = await call_tool(stub, sid, "echo", {"text": "alive"})
    assert event.result.output.blocks[0].text.text == "alive"


async def test_malformed_tool_input_is_invalid_request(stub) -> None:
    sid = await create_episode(stub, "countingenv")
    for text in ["[1]", "{nope"]:
        call = tool_call("echo")
        call.input.json = text
        error = await expect_error(stub.CallTool(pb.CallToolRequest(session_id=sid, call=call)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_reason(error) == "ERROR_REASON_INVALID_REQUEST"


async def test_json_is_lossless_through_task_spec_tool_input_and_metadata(stub) -> None:
    sid = await create_episode(stub, "countingenv", task_spec=LOSSLESS)
    _, event = await call_tool(stub, sid, "spec")
    assert exact(json.loads(event.result.output.metadata.json)) == exact(LOSSLESS)
    _, event = await call_tool(stub, sid, "raw", {"value": LOSSLESS})
    assert exact(json.loads(event.result.output.metadata.json)) == exact({"value": LOSSLESS})
    _, event = await call_tool(stub, sid, "metadata")
    output = event.result.output
    metadata = json.loads(output.metadata.json)
    assert metadata["big"] == 2**70 and isinstance(metadata["float"], float)
    assert list(metadata["nested"]) == ["z", "a"] and metadata["unicode"] == "ünïcödé ✓"
    assert exact(json.loads(output.blocks[0].text.detail.json)) == exact({"b": 1, "a": 1.0})


async def test_sixteen_mebibyte_image_round_trip(stub) -> None:
    sid = await create_episode(stub, "countingenv")
    size = 16 * 1024 * 1024
    _, event = await call_tool(stub, sid, "image", {"size": size})
    image = event.result.output.blocks[0].image
    assert image.mime_type == "image/png" and json.loads(image.detail.json) == {"size": size}
    assert image.data == image_bytes(size)


async def test_big_text_output(stub) -> None:
    sid = await create_episode(stub, "countingenv")
    _, event = await call_tool(stub, sid, "big", {"chars": 3_000_000})
    assert event.result.output.blocks[0].text.text == "x" * 3_000_000


async def test_disconnect_does_not_cancel_the_tool_and_reattach_gets_its_result(stub) -> None:
    sid = await create_episode(stub, "countingenv")
    stream = stub.CallTool(pb.CallToolRequest(session_id=sid, call=tool_call("gated")))
    task_id = (await stream.read()).task_id
    await asyncio.wait_for(CountingEnv.started.wait(), WAIT_S)
    stream.cancel()  # the client goes away mid-call
    attached = stub.CallTool(pb.CallToolRequest(session_id=sid, call=tool_call("gated", task_id=task_id)))
    assert (await attached.read()).task_id == task_id
    CountingEnv.gate.set()
    result = await attached.read()
    assert result.result.output.blocks[0].text.text == "gated done"
    # Still attachable after completion, without running the tool again.
    again_id, again = await call_tool(stub, sid, "gated", task_id=task_id)
    assert again_id == task_id and again == result
    assert CountingEnv.runs == {"gated": 1} and not CountingEnv.cancelled


async def test_task_ids_belong_to_their_session(stub) -> None:
    owner = await create_episode(stub, "countingenv")
    other = await create_episode(stub, "countingenv")
    task_id, _ = await call_tool(stub, owner, "count")
    for sid, wanted in [(other, task_id), (owner, "0" * 32)]:
        call = tool_call("count", task_id=wanted)
        error = await expect_error(stub.CallTool(pb.CallToolRequest(session_id=sid, call=call)))
        assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, "unknown task_id")
        assert error_reason(error) == "ERROR_REASON_UNKNOWN_TASK_ID"
    assert CountingEnv.runs == {"count": 1}


async def test_results_expire_after_the_linger_time() -> None:
    CountingEnv.reset()
    async with serving([CountingEnv], ServerConfig(result_linger_s=0.05)) as stub:
        sid = await create_episode(stub, "countingenv")
        task_id, _ = await call_tool(stub, sid, "count")
        request = pb.CallToolRequest(session_id=sid, call=tool_call("count", task_id=task_id))
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while True:  # no event marks the expiry: poll until it shows, bounded
            try:
                [event async for event in stub.CallTool(request)]
            except grpc.aio.AioRpcError as error:
                assert error_reason(error) == "ERROR_REASON_UNKNOWN_TASK_ID"
                break
            assert asyncio.get_running_loop().time() < deadline, "result never expired"
            await asyncio.sleep(0.05)
        assert CountingEnv.runs == {"count": 1}


async def _attachable(stub, sid: str, task_id: str) -> bool:
    request = pb.CallToolRequest(session_id=sid, call=tool_call("count", task_id=task_id))
    try:
        [event async for event in stub.CallTool(request)]
    except grpc.aio.AioRpcError as error:
        assert error_reason(error) == "ERROR_REASON_UNKNOWN_TASK_ID"
        return False
    return True


async def test_each_result_lingers_from_its_own_end() -> None:
    CountingEnv.reset()
    async with serving([CountingEnv], ServerConfig(result_linger_s=0.6)) as stub:
        sid = await create_episode(stub, "countingenv")
        first, _ = await call_tool(stub, sid, "count")
        await asyncio.sleep(0.4)
        second, _ = await call_tool(stub, sid, "count")
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while await _attachable(stub, sid, first):  # bounded poll: no event marks the expiry
            assert asyncio.get_running_loop().time() < deadline, "the first result never expired"
            await asyncio.sleep(0.02)
        assert await _attachable(stub, sid, second)  # it ended 0.4 s later: it lingers on
        while await _attachable(stub, sid, second):
            assert asyncio.get_running_loop().time() < deadline, "the second result never expired"
            await asyncio.sleep(0.02)
        assert CountingEnv.runs == {"count": 2}


async def test_no_tool_runs_after_the_episode_finished(stub) -> None:
    sid = await create_episode(stub, "countingenv", task_spec={"answer": "42"})
    _, event = await call_tool(stub, sid, "submit", {"answer": "42"})
    assert event.result.output.finished and event.result.output.reward == 1.0
    for name, tool_input in [("count", None), ("submit", {"answer": "42"})]:
        _, event = await call_tool(stub, sid, name, tool_input)
        assert event.result.error == EPISODE_FINISHED.format(name=name)
        assert event.result.reason == types_pb2.RUN_TOOL_ERROR_REASON_EPISODE_FINISHED
    assert CountingEnv.runs == {}


async def test_calls_to_the_same_tool_run_one_at_a_time(stub) -> None:
    sid = await create_episode(stub, "countingenv")
    streams = [stub.CallTool(pb.CallToolRequest(session_id=sid, call=tool_call("gated"))) for _ in range(2)]
    for stream in streams:
        assert (await stream.read()).task_id  # both calls are dispatched
    await asyncio.wait_for(CountingEnv.started.wait(), WAIT_S)
    # Another tool of the same session is not held up by the running one.
    _, event = await call_tool(stub, sid, "echo", {"text": "meanwhile"})
    assert event.result.output.blocks[0].text.text == "meanwhile"
    CountingEnv.gate.set()
    results = [await stream.read() for stream in streams]
    assert [r.result.output.blocks[0].text.text for r in results] == ["gated done"] * 2
    assert CountingEnv.runs == {"gated": 2} and CountingEnv.max_active == 1


async def test_tool_timeout_is_a_failure() -> None:
    async with serving([CountingEnv], ServerConfig(tool_timeout_s=0.2)) as stub:
        sid = await create_episode(stub, "countingenv")
        _, event = await call_tool(stub, sid, "sleep", {"seconds": 30})
        assert event.failure.message == "tool call timed out after 0.2s"
        _, event = await call_tool(stub, sid, "echo", {"text": "alive"})
        assert event.result.output.blocks[0].text.text == "alive"


async def test_sync_tool_does_not_block_other_sessions(stub) -> None:
    busy = await create_episode(stub, "countingenv")
    other = await create_episode(stub, "countingenv")
    stream = stub.CallTool(pb.CallToolRequest(session_id=busy, call=tool_call("sync_gated")))
    await stream.read()
    await asyncio.get_running_loop().run_in_executor(None, CountingEnv.sync_started.wait, WAIT_S)
    _, event = await call_tool(stub, other, "echo", {"text": "served"})
    assert event.result.output.blocks[0].text.text == "served"
    CountingEnv.sync_release.set()
    assert (await stream.read()).result.output.blocks[0].text.text == "sync done"


async def test_deleting_the_session_cancels_its_calls(stub) -> None:
    sid = await create_episode(stub, "countingenv")
    stream = stub.CallTool(pb.CallToolRequest(session_id=sid, call=tool_call("gated")))
    await stream.read()
    await asyncio.wait_for(CountingEnv.started.wait(), WAIT_S)
    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
    error = await expect_error(stream.read())
    assert error_reason(error) == "ERROR_REASON_SESSION_DELETED"
    assert CountingEnv.cancelled


class SharedStateEnv(EchoEnv):
    """Two sync tools over shared state, as written for the reference SDK,
    where sync code never overlaps."""

    first_started = threading.Event()
    release = threading.Event()
    inside = 0

    @tool
    def slow_write(self) -> ToolOutput:
        cls = type(self)
        cls.inside += 1
        cls.first_started.set()
        cls.release.wait(WAIT_S)
        cls.inside -= 1
        return ToolOutput(blocks=[TextBlock(text="written")])

    @tool
    def read(self) -> ToolOutput:
        return ToolOutput(blocks=[TextBlock(text=f"others inside: {type(self).inside}")])


async def test_sync_tools_of_one_session_never_overlap() -> None:
    SharedStateEnv.first_started.clear()
    SharedStateEnv.release.clear()
    async with serving([SharedStateEnv]) as stub:
        sid = await create_episode(stub, "sharedstateenv")
        other = await create_episode(stub, "sharedstateenv")
        writer = stub.CallTool(pb.CallToolRequest(session_id=sid, call=tool_call("slow_write")))
        await writer.read()
        await asyncio.get_running_loop().run_in_executor(None, SharedStateEnv.first_started.wait, WAIT_S)
        reader = stub.CallTool(pb.CallToolRequest(session_id=sid, call=tool_call("read")))
        await reader.read()
        # Another session's sync tools are not held up.
        _, event = await call_tool(stub, other, "read")
        assert event.result.output.blocks[0].text.text == "others inside: 1"
        SharedStateEnv.release.set()
        assert (await writer.read()).result.output.blocks[0].text.text == "written"
        assert (await reader.read()).result.output.blocks[0].text.text == "others inside: 0"
