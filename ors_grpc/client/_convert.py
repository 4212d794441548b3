"""Proto messages to and from the client's pure Python types.

Only this module touches the generated messages' fields; the rest of the client
deals in `ors_grpc.authoring.types` models and plain JSON values. User JSON travels as
JSON text (`JsonValue.json`), so `json` does the lossless part: integers stay
integers of any size, `1.0` stays a float, key order is kept.
"""

from __future__ import annotations

import base64
from typing import Any, Mapping, Optional, Union

from ors_grpc.protocol import convert as protocol_convert
from ors_grpc.protocol import json_text
from ors_grpc.protocol.enums import EPISODE_END, RUN_TOOL_ERROR_REASON, SPLIT_TYPE
from ors_grpc._generated.ors.v1 import environment_service_pb2, types_pb2
from ors_grpc.authoring.types import (
    GroupCandidate,
    GroupScore,
    ImageBlock,
    Message,
    Split,
    TerminalToolSpec,
    TextBlock,
    ToolOutput,
    ToolSpec,
)
from ors_grpc.client.types import EpisodeRecord, EpisodeTotals, ToolCallRecord

Block = Union[TextBlock, ImageBlock]

def json_value(value: Any) -> types_pb2.JsonValue:
    """A JSON value as the wire's JSON text; json_text.JsonLimitError (a
    ValueError) before anything is sent when it breaks json_text's rules."""
    return types_pb2.JsonValue(json=json_text.dumps(value))


def _optional_json(message: Any, field: str) -> Optional[Any]:
    """The JSON value of an optional JsonValue field; None when unset."""
    if not message.HasField(field):
        return None
    return json_text.loads(getattr(message, field).json, field)


def task_spec(task: types_pb2.Task) -> Any:
    return json_text.loads(task.spec.json, "task spec")


def block(message: types_pb2.Block) -> Block:
    kind = message.WhichOneof("block")
    if kind == "text":
        return TextBlock(text=message.text.text, detail=_optional_json(message.text, "detail"))
    if kind == "image":
        image = message.image
        return ImageBlock(
            # ImageBlock.data is base64 text, as in the reference SDK; gRPC carries raw bytes.
            data=base64.b64encode(image.data).decode("ascii"),
            mimeType=image.mime_type,
            detail=_optional_json(image, "detail"),
        )
    raise ValueError(f"unknown block kind {kind!r}")


def blocks(messages: Any) -> list[Block]:
    return [block(m) for m in messages]


def tool_spec(message: types_pb2.ToolSpec) -> ToolSpec:
    return ToolSpec(
        name=message.name,
        description=message.description,
        input_schema=_optional_json(message, "input_schema"),
    )


def tool_output(message: types_pb2.ToolOutput) -> ToolOutput:
    return ToolOutput(
        blocks=blocks(message.blocks),
        metadata=_optional_json(message, "metadata"),
        reward=message.reward if message.HasField("reward") else None,
        finished=message.finished,
    )


def split(message: types_pb2.Split) -> Split:
    return Split(name=message.name, type=SPLIT_TYPE.name(message.type, "validation"))


def tool_call(name: str, tool_input: Mapping[str, Any], task_id: Optional[str]) -> types_pb2.ToolCall:
    return types_pb2.ToolCall(name=name, input=json_value(dict(tool_input)), task_id=task_id or "")


def tool_call_step_request(
    name: str, tool_input: Mapping[str, Any], task_id: str
) -> environment_service_pb2.RunEpisodeRequest:
    """A RunEpisode call_tool step, written in place (a constructor copies the messages given to it)."""
    request = environment_service_pb2.RunEpisodeRequest()
    step = request.call_tool
    step.name = name
    step.input.json = json_text.dumps(tool_input)
    step.task_id = task_id
    return request


def terminal_tool(listing: Any) -> Optional[TerminalToolSpec]:
    """A tool listing's terminal tool (ListToolsResponse or ListTaskToolsResponse); None without one."""
    if not listing.HasField("terminal_tool"):
        return None
    spec = listing.terminal_tool
    return TerminalToolSpec(name=spec.name, arg=spec.arg if spec.HasField("arg") else None, description=spec.description)


def refusal_reason(result: types_pb2.RunToolResult) -> Optional[str]:
    """A refused call's reason (`not_found`, ...), None when the server gave none."""
    return RUN_TOOL_ERROR_REASON.name(result.reason)


def messages(wire: Any) -> list[Message]:
    """A GetMessages answer's messages (the same validation as the environment's)."""
    return [protocol_convert.message_from_proto(m) for m in wire]


def group_candidate(candidate: Union[GroupCandidate, Any]) -> types_pb2.GroupCandidate:
    """A GroupCandidate, or a bare sequence of Messages (or their dicts), as sent."""
    if not isinstance(candidate, GroupCandidate):
        candidate = GroupCandidate(messages=list(candidate))
    return protocol_convert.group_candidate_to_proto(candidate)


def group_scores(result: environment_service_pb2.ScoreGroupResult) -> list[GroupScore]:
    return [GroupScore(reward=s.reward, metadata=_optional_json(s, "metadata")) for s in result.scores]


def episode_record(record: environment_service_pb2.EpisodeRecord) -> EpisodeRecord:
    """The wire's EpisodeRecord as the client's dataclasses."""
    totals = record.totals
    return EpisodeRecord(
        session_id=record.session_id, env_name=record.env_name,
        task=_optional_json(record, "task"),
        toolset_name=record.toolset_name if record.HasField("toolset_name") else None,
        created_at_unix_s=record.created_at_unix_s,
        calls=[ToolCallRecord(
            tool_name=call.tool_name, input=_optional_json(call, "input"),
            input_omitted=call.input_omitted, input_bytes=call.input_bytes,
            reward=call.reward if call.HasField("reward") else None, finished=call.finished,
            refusal_reason=RUN_TOOL_ERROR_REASON.name(call.refusal_reason), error=call.error or None,
            started_at_unix_s=call.started_at_unix_s, ended_at_unix_s=call.ended_at_unix_s or None,
            output_bytes=call.output_bytes,
        ) for call in record.calls],
        calls_dropped=record.calls_dropped,
        totals=EpisodeTotals(calls=totals.calls, reward_sum=totals.reward_sum,
                             last_reward=totals.last_reward if totals.HasField("last_reward") else None,
                             finished=totals.finished),
        ended=EPISODE_END.name(record.ended), ended_at_unix_s=record.ended_at_unix_s or None,
        setup_error=record.setup_error or None,
    )
