"""The bridge's JSON <-> proto module: lossless user JSON, reference shapes, clear 422 details."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from http_bridge import _convert as convert
from ors_grpc._generated.ors.v1 import types_pb2

# Any JSON value: integers beyond 2^53, floats (1.0 is not 1), unicode, key order.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


def typed(text: str) -> str:
    """JSON text that tells 1 from 1.0 and keeps key order (unlike comparing parsed values)."""
    return json.dumps(json.loads(text))


@given(json_values, st.sampled_from([None, 2]))
def test_user_json_crosses_unchanged(value: object, indent: int | None) -> None:
    backend_text = json.dumps(value, indent=indent)  # compact or pretty, as the backend may send it
    spliced = convert.dumps({"task": convert.raw_json(types_pb2.JsonValue(json=backend_text))})
    assert "\n" not in spliced  # safe inside an SSE data line
    assert typed(spliced) == typed(json.dumps({"task": value}))


def test_tool_output_has_the_reference_shape() -> None:
    output = types_pb2.ToolOutput(
        blocks=[
            types_pb2.Block(text=types_pb2.TextBlock(text="t")),
            types_pb2.Block(image=types_pb2.ImageBlock(data=b"\x00\xff", mime_type="image/png",
                                                       detail=types_pb2.JsonValue(json='{"b":1,"a":2.0}'))),
        ],
        reward=0.0,
    )
    text = convert.run_tool_result_json(types_pb2.RunToolResult(output=output))
    assert text == (
        '{"ok":true,"output":{"blocks":[{"text":"t","detail":null,"type":"text"},'
        '{"data":"AP8=","mimeType":"image/png","detail":{"b":1,"a":2.0},"type":"image"}],'
        '"metadata":null,"reward":0.0,"finished":false}}'
    )
    # openreward's RunToolError: `reason` always present, null when the backend gives none.
    assert convert.run_tool_result_json(types_pb2.RunToolResult(error="no")) == (
        '{"ok":false,"error":"no","reason":null}'
    )
    refused = types_pb2.RunToolResult(error="gone", reason=types_pb2.RUN_TOOL_ERROR_REASON_EPISODE_FINISHED)
    assert convert.run_tool_result_json(refused) == '{"ok":false,"error":"gone","reason":"episode_finished"}'


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        (b"", "Request body is required: a JSON object"),
        (b"{", "Request body is not valid JSON: "),
        (b"[]", "Request body must be a JSON object, not an array"),
        (b"null", "Request body must be a JSON object, not null"),
        (b'{"split": "train", "index": 1.5}', "index: Input should be a valid integer"),
        (b'{"index": 1}', "split: Field required"),
    ],
)
def test_bad_bodies_name_the_problem(raw: bytes, detail: str) -> None:
    with pytest.raises(convert.BadRequest) as caught:
        convert.parse_body(raw, convert.TaskBody)
    assert caught.value.status == 422 and caught.value.detail.startswith(detail)


def test_extra_fields_are_ignored_and_task_spec_is_kept_as_sent() -> None:
    body = convert.parse_body(b'{"task_spec": {"z": 1.0, "a": 18446744073709551617}, "priority": "x"}',
                              convert.CreateBody)
    request = convert.create_episode_request("sid", body, {})
    assert request.task_spec.json == '{"z":1.0,"a":18446744073709551617}'
    assert request.WhichOneof("task_source") == "task_spec"
    assert not request.HasField("toolset_name")


def test_toolset_name_reaches_the_request() -> None:
    body = convert.parse_body(b'{"split": "train", "index": 0, "toolset_name": "scratchpad"}', convert.CreateBody)
    assert convert.create_episode_request("sid", body, {}).toolset_name == "scratchpad"


def test_indices_beyond_int64_keep_their_meaning() -> None:
    body = convert.parse_body(b'{"split": "s", "start": -100000000000000000000, "stop": 100000000000000000000}',
                              convert.TaskRangeBody)
    request = convert.task_range_request("env", body)
    assert (request.start, request.stop) == (-(2**63), 2**63 - 1)  # still "from the start to the end"


def test_secrets_header_carriers_merge_with_the_body() -> None:
    header = base64.b64encode(json.dumps({"A": {"value": "1", "allowed_domains": []}, "B": "2"}).encode()).decode()
    secrets = convert.secrets_from_header(header)
    assert secrets == {"A": "1", "B": "2"}
    body = convert.parse_body(b'{"split": "s", "index": 0, "secrets": {"B": "body"}}', convert.CreateBody)
    assert dict(convert.create_episode_request("sid", body, secrets).secrets) == {"A": "1", "B": "body"}


@pytest.mark.parametrize("header", ["%%%", base64.b64encode(b"[1]").decode(), base64.b64encode(b'{"K": {"value": 1}}').decode()])
def test_a_bad_secrets_header_is_refused_without_echoing_it(header: str) -> None:
    with pytest.raises(convert.BadRequest) as caught:
        convert.secrets_from_header(header)
    assert caught.value.status == 422 and header not in caught.value.detail


# ----------------------------------------------------------------------------
# openreward's messages and group scoring
# ----------------------------------------------------------------------------

CONVERSATION = (
    '[{"role":"system","blocks":[{"text":"Be brief.","detail":null,"type":"text"}],"detail":null},'
    '{"role":"assistant","blocks":[{"text":"hm","signature":null,"detail":{"b":1,"a":2.0},"type":"reasoning"},'
    '{"id":"c1","name":"look","input":{"n":18446744073709551617,"f":1.0},"detail":null,"type":"tool_call"}],'
    '"detail":{"turn":2}},'
    '{"role":"user","blocks":[{"tool_call_id":"c1","blocks":[{"text":"r","detail":null,"type":"text"},'
    '{"data":"AP8=","mimeType":"image/png","detail":null,"type":"image"}],"is_error":true,"detail":null,'
    '"type":"tool_result"}],"detail":null}]'
)


def test_messages_cross_both_ways_in_openreward_shape() -> None:
    """A conversation sent as a candidate comes back (as `/messages` would
    answer it) with the same text: key order, null fields, numbers."""
    body = convert.parse_body(('{"candidates":[{"messages":' + CONVERSATION + '}]}').encode(), convert.ScoreGroupBody)
    request = convert.score_group_request("sid", body)
    assert convert.dumps(convert.messages_json(request.candidates[0].messages)) == CONVERSATION
    assert request.candidates[0].messages[2].blocks[0].tool_result.blocks[1].image.data == b"\x00\xff"


def test_blocks_without_a_type_are_told_by_their_fields() -> None:
    raw = b'{"candidates":[{"messages":[{"role":"user","blocks":[{"text":"t"},{"data":"AP8=","mimeType":"m"}]}]}]}'
    request = convert.score_group_request("sid", convert.parse_body(raw, convert.ScoreGroupBody))
    blocks = request.candidates[0].messages[0].blocks
    assert [block.WhichOneof("block") for block in blocks] == ["text", "image"]
    assert not request.candidates[0].HasField("metadata") and request.task_id == ""


@pytest.mark.parametrize(
    ("candidate", "detail"),
    [
        ('{"messages":[{"role":"system","blocks":[{"type":"tool_call","id":"i","name":"n","input":{}}]}]}',
         "candidates.0.messages.0: A 'tool_call' block is not valid in a 'system' message"),
        ('{"messages":[{"role":"assistant","blocks":[{"type":"tool_result","tool_call_id":"i","blocks":[]}]}]}',
         "candidates.0.messages.0: A 'tool_result' block is not valid in a 'assistant' message"),
        ('{"messages":[{"role":"user","blocks":[{"type":"image","data":"not base64!","mimeType":"m"}]}]}',
         "candidates.0.messages.0.blocks.0.image.data: must be a base64 string"),
        ('{"messages":[{"role":"tool","blocks":[]}]}', "candidates.0.messages.0.role: Input should be"),
        ('{"messages":[{"role":"user","blocks":[{"type":"video"}]}]}', "candidates.0.messages.0.blocks.0: Input tag"),
    ],
)
def test_bad_candidates_name_the_problem(candidate: str, detail: str) -> None:
    with pytest.raises(convert.BadRequest) as caught:
        convert.parse_body(('{"candidates":[' + candidate + "]}").encode(), convert.ScoreGroupBody)
    assert caught.value.status == 422 and caught.value.detail.startswith(detail)


def test_scores_and_tool_listings_have_openreward_shapes() -> None:
    from ors_grpc._generated.ors.v1 import environment_service_pb2 as service_pb2

    result = service_pb2.ScoreGroupResult(scores=[
        types_pb2.GroupScore(reward=1.0, metadata=types_pb2.JsonValue(json='{"why":"short"}')),
        types_pb2.GroupScore(reward=0.25),
    ])
    assert convert.score_group_result_json(result) == (
        '{"scores":[{"reward":1.0,"metadata":{"why":"short"}},{"reward":0.25,"metadata":null}]}'
    )
    listing = service_pb2.ListTaskToolsResponse(
        tools=[types_pb2.ToolSpec(name="look", description="Look.")],
        terminal_tool=types_pb2.TerminalToolSpec(name="answer", description="Answer."),
        supports_score_group=True,
        message_block_types=["text", "image"],
    )
    assert convert.dumps(convert.tool_listing_json(listing)) == (
        '{"tools":[{"name":"look","description":"Look.","input_schema":null}],'
        '"terminal_tool":{"name":"answer","arg":null,"description":"Answer."},'
        '"supports_score_group":true,"message_block_types":["text","image"]}'
    )
