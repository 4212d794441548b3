"""Authoring types and user JSON <-> ors.v1 protobuf messages, service side.

The one place the service builds or reads wire messages' JSON. User JSON
travels as JSON text (see `JsonValue` in types.proto): stdlib `json` keeps
integers exact, `1.0` a float, key order and (with ensure_ascii=False)
unicode as written.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any, Union

from pydantic import BaseModel, TypeAdapter

from ._generated.ors.v1 import errors_pb2, types_pb2
from .errors import ORSError
from .types import ImageBlock, ListToolsOutput, RunToolOutput, Split, TextBlock, ToolOutput, ToolSpec

__all__ = [
    "blocks_to_proto",
    "dump_json",
    "json_value",
    "load_json_object",
    "run_tool_output_to_proto",
    "split_to_proto",
    "task_to_proto",
    "tool_specs_to_proto",
]

_SPLIT_TYPES = {
    "train": types_pb2.SPLIT_TYPE_TRAIN,
    "validation": types_pb2.SPLIT_TYPE_VALIDATION,
    "test": types_pb2.SPLIT_TYPE_TEST,
}
_BLOCKS = TypeAdapter(list[Union[TextBlock, ImageBlock]])


def _jsonable(value: Any) -> Any:
    """`json.dumps` fallback for what environments return besides plain JSON
    (pydantic models, read-only mappings, sets), like FastAPI's encoder."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (set, frozenset)) or (isinstance(value, Sequence) and not isinstance(value, str)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dump_json(value: Any) -> str:
    """Compact JSON text of a user value, lossless for JSON-shaped data."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_jsonable)


def json_value(value: Any) -> types_pb2.JsonValue:
    return types_pb2.JsonValue(json=dump_json(value))


def _optional_json_value(value: Any) -> types_pb2.JsonValue | None:
    return None if value is None else json_value(value)


def load_json_object(message: types_pb2.JsonValue, field: str) -> dict[str, Any]:
    """Parse a request's JsonValue that must be a JSON object."""
    try:
        value = json.loads(message.json)
    except ValueError as exc:
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST, f"{field}: invalid JSON ({exc})") from None
    except RecursionError:
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST, f"{field}: invalid JSON (nested too deeply)") from None
    if not isinstance(value, dict):
        raise ORSError(errors_pb2.ERROR_REASON_INVALID_REQUEST, f"{field}: must be a JSON object")
    return value


def _block_to_proto(block: TextBlock | ImageBlock) -> types_pb2.Block:
    if isinstance(block, TextBlock):
        return types_pb2.Block(
            text=types_pb2.TextBlock(text=block.text, detail=_optional_json_value(block.detail))
        )
    return types_pb2.Block(
        image=types_pb2.ImageBlock(
            # a2b_base64 takes the str as is (b64decode would copy it to bytes first).
            data=binascii.a2b_base64(block.data),
            mime_type=block.mimeType,
            detail=_optional_json_value(block.detail),
        )
    )


def blocks_to_proto(blocks: Sequence[Any]) -> list[types_pb2.Block]:
    """Prompt or output blocks (models, or dicts of their JSON shape)."""
    return [_block_to_proto(block) for block in _BLOCKS.validate_python(list(blocks))]


def _tool_spec_to_proto(spec: ToolSpec) -> types_pb2.ToolSpec:
    return types_pb2.ToolSpec(
        name=spec.name,
        description=spec.description,
        input_schema=_optional_json_value(spec.input_schema),
    )


def tool_specs_to_proto(tools: ListToolsOutput) -> list[types_pb2.ToolSpec]:
    return [_tool_spec_to_proto(spec) for spec in tools.tools]


def _tool_output_to_proto(output: ToolOutput) -> types_pb2.ToolOutput:
    return types_pb2.ToolOutput(
        blocks=blocks_to_proto(output.blocks),
        metadata=_optional_json_value(output.metadata),
        reward=output.reward,
        finished=output.finished,
    )


def run_tool_output_to_proto(result: RunToolOutput) -> types_pb2.RunToolResult:
    outcome = result.root
    if outcome.ok:
        return types_pb2.RunToolResult(output=_tool_output_to_proto(outcome.output))
    return types_pb2.RunToolResult(error=outcome.error)


def split_to_proto(split: Split | str) -> types_pb2.Split:
    """A split; bare names train/validation/test get their own type, any
    other name `validation` (as the reference does)."""
    if isinstance(split, Split):
        return types_pb2.Split(name=split.name, type=_SPLIT_TYPES[split.type])
    split_type = _SPLIT_TYPES.get(split, types_pb2.SPLIT_TYPE_VALIDATION)
    return types_pb2.Split(name=split, type=split_type)


def task_to_proto(task: Any) -> types_pb2.Task:
    return types_pb2.Task(spec=json_value(task))
