"""GetEpisodeRecord: what happened in an episode, for whoever runs the trial,
live and during the linger after it ended; bounded; never secrets."""

from __future__ import annotations

import asyncio
import json

import grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc._runtime.episode_record import MAX_RECORDED_CALLS, MAX_RECORDED_INPUT_BYTES
from ors_grpc.server import ServerConfig
from tests.support.grpc_calls import call_tool, create_episode, error_reason, expect_error, serving


async def _record(stub, sid: str) -> pb.EpisodeRecord:
    return (await stub.GetEpisodeRecord(pb.GetEpisodeRecordRequest(session_id=sid))).record


async def test_a_live_episode_records_every_call_in_order_with_totals() -> None:
    async with serving() as stub:
        sid = await create_episode(stub, task_spec={"question": "1+1?", "answer": "2"})
        await call_tool(stub, sid, "add", {"a": 1, "b": 1})
        await call_tool(stub, sid, "nope", {})
        await call_tool(stub, sid, "fail")
        await call_tool(stub, sid, "submit", {"answer": "2"})
        await call_tool(stub, sid, "echo", {"text": "late"})
        record = await _record(stub, sid)

    assert record.session_id == sid and record.env_name == "echoenv"
    assert json.loads(record.task.json) == {"question": "1+1?", "answer": "2"}
    assert [call.tool_name for call in record.calls] == ["add", "nope", "fail", "submit", "echo"]
    add, nope, fail, submit, late = record.calls
    assert json.loads(add.input.json) == {"a": 1, "b": 1} and add.reward == 0.0 and not add.finished
    assert add.output_bytes > 0 and add.ended_at_unix_s >= add.started_at_unix_s > 0
    assert nope.refusal_reason == types_pb2.RUN_TOOL_ERROR_REASON_NOT_FOUND and not nope.HasField("reward")
    assert fail.error == "boom" and fail.output_bytes == 0
    assert submit.reward == 1.0 and submit.finished
    assert late.refusal_reason == types_pb2.RUN_TOOL_ERROR_REASON_EPISODE_FINISHED and "finished" in late.error
    assert record.totals.calls == 5 and record.totals.reward_sum == 1.0
    assert record.totals.last_reward == 1.0 and record.totals.finished
    assert record.ended == pb.EPISODE_END_UNSPECIFIED and record.ended_at_unix_s == 0
    assert record.calls_dropped == 0


async def test_an_ended_episode_keeps_its_record_for_the_linger_then_not_found() -> None:
    async with serving(config=ServerConfig(result_linger_s=0.3)) as stub:
        sid = await create_episode(stub)
        await call_tool(stub, sid, "submit", {"answer": "no"})
        await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
        record = await _record(stub, sid)
        assert record.ended == pb.EPISODE_END_DELETED and record.ended_at_unix_s >= record.created_at_unix_s
        assert record.totals.finished and [call.tool_name for call in record.calls] == ["submit"]
        await asyncio.sleep(0.5)
        error = await expect_error(_record(stub, sid))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(error) == "ERROR_REASON_SESSION_NOT_FOUND"


async def test_an_unknown_session_has_no_record() -> None:
    async with serving() as stub:
        error = await expect_error(_record(stub, "no-such-session"))
    assert error_reason(error) == "ERROR_REASON_SESSION_NOT_FOUND"


async def test_secret_values_are_masked_in_inputs_and_errors() -> None:
    async with serving() as stub:
        sid = await create_episode(stub, secrets={"TOKEN": "hunter2-secret"})
        await call_tool(stub, sid, "echo", {"text": "my token is hunter2-secret", "hunter2-secret": ["hunter2-secret"]})
        await call_tool(stub, sid, "hunter2-secret", {})
        record = await _record(stub, sid)
    text = record.SerializeToString()
    assert b"hunter2-secret" not in text
    assert json.loads(record.calls[0].input.json) == {"text": "my token is ***", "***": ["***"]}
    assert record.calls[1].tool_name == "***"


async def test_the_record_keeps_the_task_and_a_calls_input_as_the_requests_wrote_them() -> None:
    task_spec = {"question": "1+1?", "answer": "2"}
    written = '{"a": 1, "b": 2.0}'  # not the compact text the server would write
    async with serving() as stub:
        sid = await create_episode(stub, task_spec=task_spec)  # (written by json.dumps: spaced)
        call = types_pb2.ToolCall(name="add", input=types_pb2.JsonValue(json=written))
        [_ async for _ in stub.CallTool(pb.CallToolRequest(session_id=sid, call=call))]
        record = await _record(stub, sid)
    assert record.task.json == json.dumps(task_spec)
    assert record.calls[0].input.json == written and record.calls[0].input_bytes == len(written)


async def test_the_record_is_bounded_in_calls_and_input_size() -> None:
    async with serving() as stub:
        sid = await create_episode(stub)
        await call_tool(stub, sid, "echo", {"text": "x" * (MAX_RECORDED_INPUT_BYTES + 1)})
        steps = [pb.RunEpisodeRequest(create=pb.CreateEpisodeRequest(env_name="echoenv", task_spec={"json": "{}"}))]
        steps += [pb.RunEpisodeRequest(call_tool=pb.ToolCallStep(name="add", task_id=f"t{i}",
                                                                 input=types_pb2.JsonValue(json='{"a":1,"b":2}')))
                  for i in range(MAX_RECORDED_CALLS + 5)]
        answers = [answer async for answer in stub.RunEpisode(iter(steps))]
        streamed = answers[0].create.session_id
        big = await _record(stub, sid)
        many = await _record(stub, streamed)
    assert big.calls[0].input_omitted and not big.calls[0].HasField("input")
    assert big.calls[0].input_bytes > MAX_RECORDED_INPUT_BYTES
    assert len(many.calls) == MAX_RECORDED_CALLS and many.calls_dropped == 5
    assert many.totals.calls == MAX_RECORDED_CALLS + 5
