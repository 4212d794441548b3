"""JSON <-> proto for the HTTP side: the one place bodies are read and JSON is written.

Request bodies are validated with small pydantic models that accept what the
reference server (ors-sdk 0.1.0) accepts, except that unknown extra fields are
ignored (newer `openreward` clients send some). A bad body raises `BadRequest`
(HTTP 422) whose detail names the field.

Text becomes protobuf strings, which must be UTF-8: a lone surrogate (JSON
`"\ud800"`, or undecodable header bytes, which aiohttp keeps as surrogates)
is refused here with HTTP 400 (`check_text`, `parse_body`; headers and paths
in `_http_server.check_request`), never left to fail as a 500.

Responses are JSON text in the reference's key order. User JSON (task specs,
schemas, `detail`, `metadata`) arrives from the backend as JSON text
(`JsonValue.json`) and is spliced in as is, so integers beyond 2^53, `1.0` vs
`1`, key order and unicode survive the hop untouched.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Annotated, Any, Iterable, Literal, Optional, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Discriminator, Tag, field_validator, model_validator

from ors_grpc._generated.ors.v1 import environment_service_pb2 as service_pb2
from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc.authoring.types import check_task_source
from ors_grpc.protocol import door, json_text
from ors_grpc.protocol.constants import MAX_JSON_DEPTH
from ors_grpc.protocol.enums import EPISODE_END, MESSAGE_ROLE, RUN_TOOL_ERROR_REASON, SPLIT_TYPE
from ors_grpc.protocol.validation import describe_validation_error

__all__ = [
    "BadRequest",
    "Body",
    "CallBody",
    "CancelPreparedBody",
    "CreateBody",
    "PrepareBody",
    "ScoreGroupBody",
    "SplitBody",
    "TaskBody",
    "TaskRangeBody",
    "blocks_json",
    "cancel_prepared_request",
    "check_text",
    "create_episode_request",
    "dumps",
    "episode_record_json",
    "idempotency_key",
    "messages_json",
    "parse_body",
    "prepare_episodes_request",
    "run_tool_result_json",
    "score_group_request",
    "score_group_result_json",
    "secrets_from_header",
    "split_json",
    "task_json",
    "task_range_request",
    "task_request",
    "tool_call_request",
    "tool_listing_json",
    "tools_json",
]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Levels a body's own fields may add around the user JSON it carries (a
#: tool_result block's `detail` in a `/score_group` candidate is 10 deep);
#: each user JSON value is then held to MAX_JSON_DEPTH itself (`_json_value`).
BODY_ENVELOPE_DEPTH = 16


class BadRequest(Exception):
    """The request does not fit the endpoint: HTTP `status` (422 for a bad body)."""

    def __init__(self, detail: str, status: int = 422) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status


# --------------------------------------------------------------------------
# Request bodies
# --------------------------------------------------------------------------


class Body(BaseModel):
    # Unknown fields are ignored, not rejected (the spec's decision).
    model_config = ConfigDict(extra="ignore")


class SplitBody(Body):
    """Body of `/tasks` and `/num_tasks`."""

    split: str


class TaskBody(Body):
    """Body of `/task` (alias `/get_task`)."""

    split: str
    index: int


class TaskRangeBody(Body):
    """Body of `/task_range` (alias `/get_task_range`)."""

    split: str
    start: Optional[int] = None
    stop: Optional[int] = None


class CreateBody(Body):
    """Body of `/create`: exactly one of `task_spec` or `split` + `index`."""

    env_name: Optional[str] = None
    # dict[str, Any] keeps the user's values exactly as json.loads made them.
    task_spec: Optional[dict[str, Any]] = None
    split: Optional[str] = None
    index: Optional[int] = None
    secrets: Optional[dict[str, str]] = None
    #: A toolset registered with the server, attached to the episode (openreward).
    toolset_name: Optional[str] = None

    @model_validator(mode="after")
    def _one_task_source(self) -> "CreateBody":
        check_task_source(self.task_spec, self.split, self.index)
        return self


class PrepareBody(Body):
    """Body of `/{env}/prepare` (an extension): `task_specs`, or `split` + `indices`."""

    task_specs: Optional[list[dict[str, Any]]] = None
    split: Optional[str] = None
    indices: Optional[list[int]] = None
    secrets: Optional[dict[str, str]] = None
    session_ids: Optional[list[str]] = None

    @model_validator(mode="after")
    def _one_task_source(self) -> "PrepareBody":
        by_index = self.split is not None or self.indices is not None
        if bool(self.task_specs) == by_index or (by_index and not (self.split and self.indices)):
            raise ValueError("Provide either task_specs or both split and indices, not both/neither")
        return self


class CancelPreparedBody(Body):
    """Body of `/{env}/cancel_prepared` (an extension): `task_specs`, or
    `split` + `indices`, or neither (every held episode of the environment)."""

    task_specs: Optional[list[dict[str, Any]]] = None
    split: Optional[str] = None
    indices: Optional[list[int]] = None
    secrets: Optional[dict[str, str]] = None

    @model_validator(mode="after")
    def _one_task_source(self) -> "CancelPreparedBody":
        by_index = self.split is not None or self.indices is not None
        if (self.task_specs and by_index) or (by_index and not (self.split and self.indices)):
            raise ValueError("Provide either task_specs or both split and indices (or neither: all), not both")
        return self


class CallBody(Body):
    """Body of `/{env}/call`."""

    name: str
    input: dict[str, Any]
    task_id: Optional[str] = None


_NOT_UTF8 = "{where} is not valid UTF-8 text (undecodable bytes or a lone surrogate)"


def check_text(value: str, where: str) -> str:
    """`value` if it can become a protobuf string (UTF-8 encodable), else
    BadRequest 400 naming `where` (never showing the text)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(_NOT_UTF8.format(where=where[:1].upper() + where[1:]), status=400) from None
    return value


#: A JSON escape of a UTF-16 surrogate: only such a body can decode to a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _check_json_text(raw: bytes, value: Any) -> None:
    if _SURROGATE_ESCAPE.search(raw):
        check_text(json.dumps(value, ensure_ascii=False), "the request's JSON")


# Message blocks, shaped like openreward's (`type` tells them apart; a block
# without one is told by its fields, as openreward's union does).


class TextBlockBody(Body):
    text: str
    detail: Optional[dict[str, Any]] = None
    type: Literal["text"] = "text"


class ImageBlockBody(Body):
    data: bytes  # base64 in JSON, raw bytes in the proto
    mimeType: str
    detail: Optional[dict[str, Any]] = None
    type: Literal["image"] = "image"

    @field_validator("data", mode="before")
    @classmethod
    def _base64(cls, value: Any) -> bytes:
        if not isinstance(value, str):
            raise ValueError("must be a base64 string")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("must be a base64 string") from None


class ReasoningBlockBody(Body):
    text: str
    signature: Optional[str] = None
    detail: Optional[dict[str, Any]] = None
    type: Literal["reasoning"] = "reasoning"


class ToolCallBlockBody(Body):
    id: str
    name: str
    input: dict[str, Any]
    detail: Optional[dict[str, Any]] = None
    type: Literal["tool_call"] = "tool_call"


def _block_type(value: Any) -> str:
    if isinstance(value, dict):
        if "type" in value:
            return value["type"]
        for field, block_type in (("data", "image"), ("tool_call_id", "tool_result"), ("id", "tool_call")):
            if field in value:
                return block_type
    return "text"


PlainBlockBody = Annotated[
    Union[Annotated[TextBlockBody, Tag("text")], Annotated[ImageBlockBody, Tag("image")]],
    Discriminator(_block_type),
]


class ToolResultBlockBody(Body):
    tool_call_id: str
    blocks: list[PlainBlockBody]
    is_error: bool = False
    detail: Optional[dict[str, Any]] = None
    type: Literal["tool_result"] = "tool_result"


MessageBlockBody = Annotated[
    Union[
        Annotated[TextBlockBody, Tag("text")],
        Annotated[ImageBlockBody, Tag("image")],
        Annotated[ReasoningBlockBody, Tag("reasoning")],
        Annotated[ToolCallBlockBody, Tag("tool_call")],
        Annotated[ToolResultBlockBody, Tag("tool_result")],
    ],
    Discriminator(_block_type),
]

#: The block types each role may carry (openreward's placement rule).
ROLE_BLOCK_TYPES = {
    "system": frozenset({"text", "image"}),
    "user": frozenset({"text", "image", "tool_result"}),
    "assistant": frozenset({"text", "image", "reasoning", "tool_call"}),
}


class MessageBody(Body):
    role: Literal["system", "user", "assistant"]
    blocks: list[MessageBlockBody]
    detail: Optional[dict[str, Any]] = None

    @model_validator(mode="after")
    def _placement(self) -> "MessageBody":
        for block in self.blocks:
            if block.type not in ROLE_BLOCK_TYPES[self.role]:
                raise ValueError(
                    f"A {block.type!r} block is not valid in a {self.role!r} message: reasoning and tool_call "
                    "blocks belong in 'assistant' turns, tool_result blocks in 'user' turns"
                )
        return self


class CandidateBody(Body):
    messages: list[MessageBody]
    metadata: Optional[dict[str, Any]] = None


class ScoreGroupBody(Body):
    """Body of `/{env}/score_group`."""

    candidates: list[CandidateBody]
    task_id: Optional[str] = None


def parse_body(raw: bytes, model: type[Body]) -> Any:
    """Parse and validate a JSON request body, or raise BadRequest."""
    if not raw.strip():
        raise BadRequest("Request body is required: a JSON object")
    try:
        value = json_text.loads(raw, "body", MAX_JSON_DEPTH + BODY_ENVELOPE_DEPTH)
    except json_text.JsonLimitError as exc:  # too deep, or NaN: 400 as the gRPC door's JSON_LIMIT
        raise BadRequest(str(exc), status=400) from None
    except ValueError as exc:  # also bad UTF-8, and integers over the digit limit
        raise BadRequest(f"Request body is not valid JSON: {exc}") from None
    _check_json_text(raw, value)
    if not isinstance(value, dict):
        raise BadRequest(f"Request body must be a JSON object, not {_json_type(value)}")
    try:
        # The model's validator itself: `model_validate` costs as much again around it.
        return model.__pydantic_validator__.validate_python(value)
    except pydantic.ValidationError as exc:
        raise BadRequest(describe_validation_error(exc, quote_input=False)) from None


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _int64(value: int) -> int:
    # Proto fields are int64; clamping keeps Python-slice and index semantics
    # (no split has 2^63 tasks) while avoiding an overflow on the hop.
    return max(INT64_MIN, min(INT64_MAX, value))


def _json_value(value: Any, field: str) -> types_pb2.JsonValue:
    """A body's user JSON value as a JsonValue (see `_json_text`)."""
    return types_pb2.JsonValue(json=_json_text(value, field))


def _json_text(value: Any, field: str) -> str:
    """A body's user JSON value as JSON text; BadRequest 400 naming `field`
    when it breaks json_text's rules (deeper than MAX_JSON_DEPTH itself)."""
    try:
        return json_text.dumps(value, field)
    except json_text.JsonLimitError as exc:
        raise BadRequest(str(exc), status=400) from None


def secrets_from_header(header: Optional[str]) -> dict[str, str]:
    """Secrets from `X-Secrets` (`ors_grpc.protocol.door.secrets_from_header`); BadRequest when malformed."""
    try:
        return door.secrets_from_header(header)
    except json_text.JsonLimitError as exc:
        raise BadRequest(str(exc), status=400) from None
    except UnicodeEncodeError:
        raise BadRequest(_NOT_UTF8.format(where="The request's JSON"), status=400) from None
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def create_episode_request(
    session_id: str, body: CreateBody, header_secrets: dict[str, str]
) -> service_pb2.CreateEpisodeRequest:
    """The CreateEpisode request of a `/create` body; body secrets win over the header's."""
    request = service_pb2.CreateEpisodeRequest(
        session_id=session_id,
        env_name=body.env_name or "",
        secrets={**header_secrets, **(body.secrets or {})},
    )
    if body.toolset_name is not None:
        request.toolset_name = body.toolset_name
    if body.task_spec is not None:
        request.task_spec.CopyFrom(_json_value(body.task_spec, "task_spec"))
    else:
        request.task_index.CopyFrom(service_pb2.TaskIndex(split=body.split, index=_int64(body.index)))
    return request


def task_range_request(env_name: str, body: TaskRangeBody) -> service_pb2.GetTaskRangeRequest:
    request = service_pb2.GetTaskRangeRequest(env_name=env_name, split=body.split)
    if body.start is not None:
        request.start = _int64(body.start)
    if body.stop is not None:
        request.stop = _int64(body.stop)
    return request


def task_request(env_name: str, body: TaskBody) -> service_pb2.GetTaskRequest:
    return service_pb2.GetTaskRequest(env_name=env_name, split=body.split, index=_int64(body.index))


def tool_call_request(session_id: str, body: CallBody, idempotency_key: str = "") -> service_pb2.CallToolRequest:
    request = service_pb2.CallToolRequest()
    # Filled in place: a message handed to a constructor is copied, once per enclosing message.
    request.session_id = session_id
    if idempotency_key:
        request.idempotency_key = idempotency_key
    call = request.call
    call.name = body.name
    call.input.json = _json_text(body.input, "input")
    if body.task_id:
        call.task_id = body.task_id
    return request


def idempotency_key(header: Optional[str]) -> str:
    """The `Idempotency-Key` header's key ("" without one). The IETF draft
    sends it as a quoted string; a bare token is taken as it is."""
    key = (header or "").strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if header is not None and not key:
        raise BadRequest("Idempotency-Key header must not be empty")
    return key


def prepare_episodes_request(
    env_name: str, body: PrepareBody, header_secrets: dict[str, str], header_session_id: Optional[str] = None,
) -> service_pb2.PrepareEpisodesRequest:
    """The PrepareEpisodes request of a `/{env}/prepare` body; body secrets win
    over the header's. The episodes are reserved for the body's `session_ids`,
    else for the `X-Session-ID` header's id (one episode, routed by it)."""
    session_ids = body.session_ids or ([header_session_id] if header_session_id else [])
    return service_pb2.PrepareEpisodesRequest(
        env_name=env_name, session_ids=session_ids, **_prepared_tasks(body, header_secrets)
    )


def cancel_prepared_request(
    env_name: str, body: CancelPreparedBody, header_secrets: dict[str, str]
) -> service_pb2.CancelPreparedEpisodesRequest:
    """The CancelPreparedEpisodes request of a `/{env}/cancel_prepared` body; body secrets win over the header's."""
    return service_pb2.CancelPreparedEpisodesRequest(env_name=env_name, **_prepared_tasks(body, header_secrets))


def _prepared_tasks(body: PrepareBody | CancelPreparedBody, header_secrets: dict[str, str]) -> dict[str, Any]:
    """The fields that name prepared episodes' tasks and secrets, shared by
    PrepareEpisodes and CancelPreparedEpisodes; body secrets win over the header's."""
    return {
        "task_specs": [_json_value(spec, f"task_specs[{i}]") for i, spec in enumerate(body.task_specs or ())],
        "split": body.split or "",
        "indices": [_int64(index) for index in body.indices or ()],
        "secrets": {**header_secrets, **(body.secrets or {})},
    }


def _optional_json(value: Optional[dict[str, Any]], field: str) -> Optional[types_pb2.JsonValue]:
    return None if value is None else _json_value(value, field)


def _text_proto(block: TextBlockBody) -> types_pb2.TextBlock:
    return types_pb2.TextBlock(text=block.text, detail=_optional_json(block.detail, "a block's detail"))


def _image_proto(block: ImageBlockBody) -> types_pb2.ImageBlock:
    detail = _optional_json(block.detail, "a block's detail")
    return types_pb2.ImageBlock(data=block.data, mime_type=block.mimeType, detail=detail)


def _plain_block_proto(block: Union[TextBlockBody, ImageBlockBody]) -> types_pb2.Block:
    if isinstance(block, ImageBlockBody):
        return types_pb2.Block(image=_image_proto(block))
    return types_pb2.Block(text=_text_proto(block))


def _message_block_proto(block: Any) -> types_pb2.MessageBlock:
    detail = _optional_json(block.detail, "a block's detail")
    if isinstance(block, ImageBlockBody):
        return types_pb2.MessageBlock(image=_image_proto(block))
    if isinstance(block, ReasoningBlockBody):
        reasoning = types_pb2.ReasoningBlock(text=block.text, signature=block.signature, detail=detail)
        return types_pb2.MessageBlock(reasoning=reasoning)
    if isinstance(block, ToolCallBlockBody):
        tool_input = _json_value(block.input, "a tool_call block's input")
        call = types_pb2.ToolCallBlock(id=block.id, name=block.name, input=tool_input, detail=detail)
        return types_pb2.MessageBlock(tool_call=call)
    if isinstance(block, ToolResultBlockBody):
        result = types_pb2.ToolResultBlock(
            tool_call_id=block.tool_call_id,
            blocks=[_plain_block_proto(inner) for inner in block.blocks],
            is_error=block.is_error,
            detail=detail,
        )
        return types_pb2.MessageBlock(tool_result=result)
    return types_pb2.MessageBlock(text=_text_proto(block))


def _message_proto(message: MessageBody) -> types_pb2.Message:
    return types_pb2.Message(
        role=MESSAGE_ROLE.value(message.role),
        blocks=[_message_block_proto(block) for block in message.blocks],
        detail=_optional_json(message.detail, "a message's detail"),
    )


def score_group_request(
    session_id: str, body: ScoreGroupBody, idempotency_key: str = ""
) -> service_pb2.ScoreGroupRequest:
    candidates = [
        types_pb2.GroupCandidate(
            messages=[_message_proto(message) for message in candidate.messages],
            metadata=_optional_json(candidate.metadata, "a candidate's metadata"),
        )
        for candidate in body.candidates
    ]
    return service_pb2.ScoreGroupRequest(
        session_id=session_id, candidates=candidates, task_id=body.task_id or "", idempotency_key=idempotency_key
    )


# --------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------


#: JSON text of a str, as `json.dumps(..., ensure_ascii=False)` writes it.
_encode_string = json.encoder.encode_basestring


class Raw(str):
    """JSON text to splice into output as is."""


def dumps(value: Any) -> str:
    """Compact JSON (like pydantic's `model_dump_json`) with `Raw` spliced in."""
    parts: list[str] = []
    _dump(value, parts)
    # One join at the end: a multi-megabyte image is copied once, not once
    # per level of nesting (four in a tool result).
    return "".join(parts)


def _dump(value: Any, parts: list[str]) -> None:
    # Dispatch on the exact type, and a dict's scalar members written in its own loop: a tool
    # result is one or two calls of this rather than one per value (a third of the time).
    kind = type(value)
    if kind is dict:
        opening = "{"
        for key, item in value.items():
            parts.append(f"{opening}{_encode_string(key)}:")
            opening = ","
            kind = type(item)
            if kind is str:
                parts.append(_encode_string(item))
            elif kind is Raw:
                parts.append(item)
            elif item is None:
                parts.append("null")
            elif kind is bool:
                parts.append("true" if item else "false")
            else:
                _dump(item, parts)
        parts.append("}" if opening == "," else "{}")
    elif kind is list or kind is tuple:
        opening = "["
        for item in value:
            parts.append(opening)
            opening = ","
            _dump(item, parts)
        parts.append("]" if opening == "," else "[]")
    elif kind is Raw:
        parts.append(value)
    else:
        parts.append(_scalar(value))


def _scalar(value: Any) -> str:
    kind = type(value)
    if kind is str:  # most scalars: keys, texts, names (json.dumps's own escaping, without its set-up)
        return _encode_string(value)
    if kind is bool or value is None:
        return "true" if value is True else "false" if value is False else "null"
    return json_text.dumps(value)


_NULL = Raw("null")


def _compact(text: str) -> str:
    """User JSON text as one line: pretty-printed text is written again,
    since SSE data lines cannot hold newlines."""
    if "\n" in text or "\r" in text:
        return _scalar(json.loads(text))
    return text


def raw_json(value: types_pb2.JsonValue, present: bool = True) -> Raw:
    """User JSON from the backend, or `null` when unset."""
    if not present or not value.json:
        return _NULL
    return Raw(_compact(value.json))


def _detail(block: Any) -> str:
    """A block's `detail` as JSON text (`null` when unset)."""
    return _compact(block.detail.json) or "null" if block.HasField("detail") else "null"


# Text and image blocks are written as JSON text at once (spliced as `Raw`):
# a tool result holds one or two, and every `/call` answers one.


def _block_text(block: types_pb2.Block | types_pb2.MessageBlock) -> str:
    """A text or image block (of a Block or MessageBlock) as JSON text."""
    if block.WhichOneof("block") == "image":
        image = block.image
        # The base64 alphabet needs no JSON escaping: no encoder scans it.
        data = base64.b64encode(image.data).decode("ascii")
        return (f'{{"data":"{data}","mimeType":{_encode_string(image.mime_type)},"detail":{_detail(image)},'
                '"type":"image"}')
    text = block.text
    return f'{{"text":{_encode_string(text.text)},"detail":{_detail(text)},"type":"text"}}'


def blocks_json(blocks: Iterable[types_pb2.Block]) -> Raw:
    """Blocks as a JSON array (text, spliced by `dumps`)."""
    return Raw("[" + ",".join([_block_text(block) for block in blocks]) + "]")


def _message_block(block: types_pb2.MessageBlock) -> dict[str, Any]:
    """A message block in openreward's key order."""
    kind = block.WhichOneof("block")
    if kind == "reasoning":
        reasoning = block.reasoning
        return {
            "text": reasoning.text,
            "signature": reasoning.signature if reasoning.HasField("signature") else None,
            "detail": raw_json(reasoning.detail, reasoning.HasField("detail")),
            "type": "reasoning",
        }
    if kind == "tool_call":
        call = block.tool_call
        return {
            "id": call.id,
            "name": call.name,
            "input": raw_json(call.input, call.HasField("input")),
            "detail": raw_json(call.detail, call.HasField("detail")),
            "type": "tool_call",
        }
    if kind == "tool_result":
        result = block.tool_result
        return {
            "tool_call_id": result.tool_call_id,
            "blocks": blocks_json(result.blocks),
            "is_error": result.is_error,
            "detail": raw_json(result.detail, result.HasField("detail")),
            "type": "tool_result",
        }
    return Raw(_block_text(block))


def messages_json(messages: Iterable[types_pb2.Message]) -> list[dict[str, Any]]:
    """`[Message]`: `{"role", "blocks", "detail"}` each, as openreward answers `/messages`."""
    return [
        {
            "role": MESSAGE_ROLE.name(message.role, "user"),
            "blocks": [_message_block(block) for block in message.blocks],
            "detail": raw_json(message.detail, message.HasField("detail")),
        }
        for message in messages
    ]


def tools_json(tools: Iterable[types_pb2.ToolSpec]) -> dict[str, Any]:
    """ListToolsOutput: `{"tools": [{"name", "description", "input_schema"}]}`."""
    return {
        "tools": [
            {
                "name": tool.name,
                "description": tool.description,
                "input_schema": raw_json(tool.input_schema, tool.HasField("input_schema")),
            }
            for tool in tools
        ]
    }


def tool_listing_json(
    listing: Union[service_pb2.ListToolsResponse, service_pb2.ListTaskToolsResponse],
) -> dict[str, Any]:
    """ListToolsOutput with openreward's fields: `{"tools", "terminal_tool",
    "supports_score_group", "message_block_types"}` (ors-sdk clients read
    `tools` only)."""
    output = tools_json(listing.tools)
    terminal = listing.terminal_tool
    output["terminal_tool"] = (
        {"name": terminal.name, "arg": terminal.arg if terminal.HasField("arg") else None,
         "description": terminal.description}
        if listing.HasField("terminal_tool")
        else None
    )
    output["supports_score_group"] = listing.supports_score_group
    output["message_block_types"] = list(listing.message_block_types)
    return output


def split_json(split: types_pb2.Split) -> dict[str, Any]:
    return {"name": split.name, "type": SPLIT_TYPE.name(split.type, "validation")}


def task_json(task: types_pb2.Task) -> Raw:
    return raw_json(task.spec, task.HasField("spec"))


def run_tool_result_json(result: types_pb2.RunToolResult) -> str:
    """RunToolOutput as compact JSON text: the payload of a `/call` stream."""
    if result.WhichOneof("outcome") == "error":
        return dumps({"ok": False, "error": result.error, "reason": RUN_TOOL_ERROR_REASON.name(result.reason)})
    output = result.output
    # Written at once (the hottest answer there is), key for key what `dumps` would write of the same dict.
    metadata = _compact(output.metadata.json) or "null" if output.HasField("metadata") else "null"
    reward = _scalar(output.reward) if output.HasField("reward") else "null"
    return (f'{{"ok":true,"output":{{"blocks":{blocks_json(output.blocks)},"metadata":{metadata},'
            f'"reward":{reward},"finished":{"true" if output.finished else "false"}}}}}')


def score_group_result_json(result: service_pb2.ScoreGroupResult) -> str:
    """ScoreGroupOutput as compact JSON text: the payload of a `/score_group` stream."""
    return dumps(
        {
            "scores": [
                {"reward": score.reward, "metadata": raw_json(score.metadata, score.HasField("metadata"))}
                for score in result.scores
            ]
        }
    )


def _optional_number(message: Any, field: str) -> Optional[float]:
    return getattr(message, field) if message.HasField(field) else None


def server_stats_json(response: service_pb2.GetServerStatsResponse) -> dict[str, Any]:
    """`/server_stats`: GetServerStats as JSON (an absent latency is null)."""
    return {
        "environments": [
            {
                "env_name": stats.env_name,
                "open_sessions": stats.open_sessions,
                "prepared_episodes": stats.prepared_episodes,
                "tool_calls_in_flight": stats.tool_calls_in_flight,
                "tool_calls_per_second": stats.tool_calls_per_second,
                "call_latency_p50_ms": _optional_number(stats, "call_latency_p50_ms"),
                "call_latency_p99_ms": _optional_number(stats, "call_latency_p99_ms"),
                "recent_errors": [
                    {"time_unix_ms": error.time_unix_ms, "source": error.source, "message": error.message}
                    for error in stats.recent_errors
                ],
            }
            for stats in response.environments
        ],
        "window_seconds": response.window_seconds,
    }


def _tool_call_record_json(call: service_pb2.ToolCallRecord) -> dict[str, Any]:
    return {
        "tool_name": call.tool_name,
        "input": raw_json(call.input, call.HasField("input")),
        "input_omitted": call.input_omitted,
        "input_bytes": call.input_bytes,
        "reward": call.reward if call.HasField("reward") else None,
        "finished": call.finished,
        "refusal_reason": RUN_TOOL_ERROR_REASON.name(call.refusal_reason),
        "error": call.error or None,
        "started_at_unix_s": call.started_at_unix_s,
        "ended_at_unix_s": call.ended_at_unix_s or None,
        "output_bytes": call.output_bytes,
    }


def episode_record_json(record: service_pb2.EpisodeRecord) -> dict[str, Any]:
    """An EpisodeRecord as the JSON of `GET /{env}/episode` (see its proto comments)."""
    totals = record.totals
    return {
        "session_id": record.session_id,
        "env_name": record.env_name,
        "task": raw_json(record.task, record.HasField("task")),
        "toolset_name": record.toolset_name if record.HasField("toolset_name") else None,
        "created_at_unix_s": record.created_at_unix_s,
        "calls": [_tool_call_record_json(call) for call in record.calls],
        "calls_dropped": record.calls_dropped,
        "totals": {
            "calls": totals.calls,
            "reward_sum": totals.reward_sum,
            "last_reward": totals.last_reward if totals.HasField("last_reward") else None,
            "finished": totals.finished,
        },
        "ended": EPISODE_END.name(record.ended),
        "ended_at_unix_s": record.ended_at_unix_s or None,
        "setup_error": record.setup_error or None,
    }
