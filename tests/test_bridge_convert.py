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
    assert convert.run_tool_result_json(types_pb2.RunToolResult(error="no")) == '{"ok":false,"error":"no"}'


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
    body = convert.parse_body(b'{"task_spec": {"z": 1.0, "a": 18446744073709551617}, "toolset_name": "x"}',
                              convert.CreateBody)
    request = convert.create_episode_request("sid", body, {})
    assert request.task_spec.json == '{"z":1.0,"a":18446744073709551617}'
    assert request.WhichOneof("task_source") == "task_spec"


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
