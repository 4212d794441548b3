"""Authoring types and user JSON <-> ors.v1 protobuf messages, service side.

The one place the service builds or reads wire messages' JSON. User JSON
travels as JSON text (see `JsonValue` in types.proto): stdlib `json` keeps
integers exact, `1.0` a float, key order and (with ensure_ascii=False)
unicode as written.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Any, Union

from pydantic import TypeAdapter

from ors_grpc._generated.ors.v1 import errors_pb2, types_pb2
from ors_grpc.protocol import json_text
from ors_grpc.protocol.enums import MESSAGE_ROLE, RUN_TOOL_ERROR_REASON, SPLIT_TYPE
from ors_grpc.protocol.errors import ORSError, json_limit
from ors_grpc.authoring.types import (
    GroupCandidate,
    GroupScore,
    ImageBlock,
    ListToolsOutput,
    Message,
    ReasoningBlock,
    RunToolOutput,
    Split,
    TerminalToolSpec,
    TextBlock,
    ToolCallBlock,
    ToolOutput,
    ToolSpec,
)

__all__ = [
    "group_candidate_to_proto",
    "group_candidates_from_proto",
    "group_scores_to_proto",
    "json_value",
    "load_json_object",
    "message_from_proto",
    "messages_to_proto",
    "parse_json_object",
    "run_tool_output_to_proto",
    "split_to_proto",
    "task_to_proto",
    "tool_listing",
    "tool_specs_to_proto",
    "write_blocks",
]

_BLOCKS = TypeAdapter(list[Union[TextBlock, ImageBlock]])
_MESSAGES = TypeAdapter(list[Message])
_SCORES = TypeAdapter(list[Union[GroupScore, float]])


def json_value(value: Any, field: str = "the value") -> types_pb2.JsonValue:
    """A user value as a JsonValue; json_text.JsonLimitError naming `field` when it breaks json_text's rules."""
    return types_pb2.JsonValue(json=json_text.dumps(value, field))


def _optional_json_value(value: Any, field: str = "the value") -> types_pb2.JsonValue | None:
    return None if value is None else json_value(value, field)


def load_json_object(message: types_pb2.JsonValue, field: str) -> dict[str, Any]:
    """Parse a request's JsonValue that must be a JSON object: JSON_LIMIT
    when it breaks json_text's rules, INVALID_REQUEST when it is not JSON."""
    return parse_json_object(message.json, field)


def parse_json_object(text: str, field: str) -> dict[str, Any]:
    """`load_json_object` of a JsonValue's text (read once by a caller that keeps it)."""
    try:
        value = json_text.loads(text, field)
    except json_text.JsonLimitError as exc:
        raise json_limit(exc) from None
    except ValueError as exc:
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST, f"{field}: invalid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST, f"{field}: must be a JSON object")
    return value


def _write_block(target: types_pb2.Block | types_pb2.MessageBlock, block: TextBlock | ImageBlock) -> None:
    """A text or image block, written into `target` in place (the writers
    below all do: a message handed to a constructor is copied, an image's
    bytes included). Assigning a field sets its message in the parent, "" too."""
    if isinstance(block, TextBlock):
        text = target.text
        text.text = block.text
        if block.detail is not None:
            text.detail.json = json_text.dumps(block.detail, "a block's detail")
        return
    image = target.image
    # a2b_base64 takes the str as is (b64decode would copy it to bytes first).
    image.data = binascii.a2b_base64(block.data)
    image.mime_type = block.mimeType
    if block.detail is not None:
        image.detail.json = json_text.dumps(block.detail, "a block's detail")


def write_blocks(target: Any, blocks: Sequence[Any]) -> None:
    """Prompt or output blocks (models, or dicts of their JSON shape), added to `target` (a repeated Block field)."""
    blocks = list(blocks)  # (any iterable an environment returned)
    if not all(isinstance(block, (TextBlock, ImageBlock)) for block in blocks):  # (models, the usual, pass as they are)
        blocks = _BLOCKS.validate_python(blocks)
    for block in blocks:
        _write_block(target.add(), block)


def _tool_spec_to_proto(spec: ToolSpec) -> types_pb2.ToolSpec:
    return types_pb2.ToolSpec(
        name=spec.name,
        description=spec.description,
        input_schema=_optional_json_value(spec.input_schema, "a tool's input_schema"),
    )


def tool_specs_to_proto(tools: ListToolsOutput) -> list[types_pb2.ToolSpec]:
    return [_tool_spec_to_proto(spec) for spec in tools.tools]


def _terminal_tool_to_proto(spec: TerminalToolSpec) -> types_pb2.TerminalToolSpec:
    return types_pb2.TerminalToolSpec(name=spec.name, arg=spec.arg, description=spec.description)


def tool_listing(tools: ListToolsOutput) -> dict[str, Any]:
    """The fields of a ListToolsResponse or ListTaskToolsResponse."""
    return {
        "tools": tool_specs_to_proto(tools),
        "terminal_tool": None if tools.terminal_tool is None else _terminal_tool_to_proto(tools.terminal_tool),
        "supports_score_group": bool(tools.supports_score_group),
        "message_block_types": tools.message_block_types or [],
    }


def _message_block_to_proto(block: Any) -> types_pb2.MessageBlock:
    if isinstance(block, (TextBlock, ImageBlock)):
        written = types_pb2.MessageBlock()
        _write_block(written, block)
        return written
    detail = _optional_json_value(block.detail, "a block's detail")
    if isinstance(block, ReasoningBlock):
        return types_pb2.MessageBlock(
            reasoning=types_pb2.ReasoningBlock(text=block.text, signature=block.signature, detail=detail)
        )
    if isinstance(block, ToolCallBlock):
        return types_pb2.MessageBlock(tool_call=types_pb2.ToolCallBlock(
            id=block.id, name=block.name, input=json_value(block.input, "a tool_call block's input"), detail=detail
        ))
    written = types_pb2.MessageBlock()
    result = written.tool_result
    result.tool_call_id, result.is_error = block.tool_call_id, block.is_error
    write_blocks(result.blocks, block.blocks)
    if detail is not None:
        result.detail.CopyFrom(detail)
    return written


def _message_to_proto(message: Message) -> types_pb2.Message:
    return types_pb2.Message(
        role=MESSAGE_ROLE.value(message.role),
        blocks=[_message_block_to_proto(block) for block in message.blocks],
        detail=_optional_json_value(message.detail, "a message's detail"),
    )


def messages_to_proto(messages: Sequence[Any]) -> list[types_pb2.Message]:
    """Messages (models, or dicts of their JSON shape), validated."""
    return [_message_to_proto(message) for message in _MESSAGES.validate_python(list(messages))]


def _loaded(message: Any, field: str, where: str) -> Any:
    """An optional JsonValue field's value (None when unset); ValueError when
    it is not JSON, json_text.JsonLimitError naming `where` when it breaks the rules."""
    return json_text.loads(getattr(message, field).json, f"{where}.{field}") if message.HasField(field) else None


def block_from_proto(message: types_pb2.Block | types_pb2.MessageBlock, where: str = "block") -> dict[str, Any]:
    """A block's JSON shape (as a dict, for the models to validate); `where` names it in errors."""
    kind = message.WhichOneof("block")
    inner = getattr(message, kind) if kind else None
    if kind == "text":
        return {"text": inner.text, "detail": _loaded(inner, "detail", where), "type": "text"}
    if kind == "image":
        data = binascii.b2a_base64(inner.data, newline=False).decode("ascii")
        return {"data": data, "mimeType": inner.mime_type, "detail": _loaded(inner, "detail", where), "type": "image"}
    if kind == "reasoning":
        signature = inner.signature if inner.HasField("signature") else None
        return {"text": inner.text, "signature": signature, "detail": _loaded(inner, "detail", where),
                "type": "reasoning"}
    if kind == "tool_call":
        tool_input = _loaded(inner, "input", where)
        return {"id": inner.id, "name": inner.name, "input": {} if tool_input is None else tool_input,
                "detail": _loaded(inner, "detail", where), "type": "tool_call"}
    if kind == "tool_result":
        blocks = [block_from_proto(b, f"{where}.blocks[{i}]") for i, b in enumerate(inner.blocks)]
        return {"tool_call_id": inner.tool_call_id, "blocks": blocks,
                "is_error": inner.is_error, "detail": _loaded(inner, "detail", where), "type": "tool_result"}
    raise ValueError("a block has no content")


def message_from_proto(message: types_pb2.Message, where: str = "message") -> Message:
    """A wire message as the model; ValueError (pydantic's ValidationError
    included) when it is not a valid message; `where` names it in errors."""
    role = MESSAGE_ROLE.name(message.role)
    if role is None:
        raise ValueError("a message has no role")
    return Message.model_validate({
        "role": role,
        "blocks": [block_from_proto(block, f"{where}.blocks[{i}]") for i, block in enumerate(message.blocks)],
        "detail": _loaded(message, "detail", where),
    })


def group_candidates_from_proto(candidates: Sequence[types_pb2.GroupCandidate]) -> list[GroupCandidate]:
    """A ScoreGroup request's candidates; JSON_LIMIT or INVALID_REQUEST when one is not valid."""
    try:
        return [
            GroupCandidate(
                messages=[message_from_proto(m, f"candidates[{c}].messages[{i}]")
                          for i, m in enumerate(candidate.messages)],
                metadata=_loaded(candidate, "metadata", f"candidates[{c}]"),
            )
            for c, candidate in enumerate(candidates)
        ]
    except json_text.JsonLimitError as exc:
        raise json_limit(exc) from None
    except ValueError as exc:
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST, f"candidates: {exc}") from None


def group_candidate_to_proto(candidate: GroupCandidate) -> types_pb2.GroupCandidate:
    return types_pb2.GroupCandidate(
        messages=[_message_to_proto(message) for message in candidate.messages],
        metadata=_optional_json_value(candidate.metadata, "a candidate's metadata"),
    )


def group_scores_to_proto(scores: Sequence[Any]) -> list[types_pb2.GroupScore]:
    """What `score_group` returned (GroupScores or bare floats, which become
    `{reward}`) as wire scores; ValueError when it is neither."""
    return [
        types_pb2.GroupScore(reward=score, metadata=None) if isinstance(score, float)
        else types_pb2.GroupScore(
            reward=score.reward, metadata=_optional_json_value(score.metadata, "a score's metadata"))
        for score in _SCORES.validate_python(list(scores))
    ]


def _write_tool_output(target: types_pb2.ToolOutput, output: ToolOutput) -> None:
    write_blocks(target.blocks, output.blocks)
    if output.metadata is not None:
        target.metadata.json = json_text.dumps(output.metadata, "the tool output's metadata")
    if output.reward is not None:
        target.reward = output.reward
    target.finished = output.finished  # (sets `output` in its parent, False too)


def run_tool_output_to_proto(result: RunToolOutput) -> types_pb2.RunToolResult:
    outcome = result.root
    if outcome.ok:
        message = types_pb2.RunToolResult()
        _write_tool_output(message.output, outcome.output)
        return message
    return types_pb2.RunToolResult(error=outcome.error, reason=RUN_TOOL_ERROR_REASON.value(outcome.reason))


def split_to_proto(split: Split | str) -> types_pb2.Split:
    """A split; bare names train/validation/test get their own type, any
    other name `validation` (as the reference does)."""
    if isinstance(split, Split):
        return types_pb2.Split(name=split.name, type=SPLIT_TYPE.value(split.type))
    return types_pb2.Split(name=split, type=SPLIT_TYPE.value_or(split, types_pb2.SPLIT_TYPE_VALIDATION))


def task_to_proto(task: Any) -> types_pb2.Task:
    return types_pb2.Task(spec=json_value(task, "a task"))
