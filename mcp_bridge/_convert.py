"""ORS messages ⇄ MCP types: the one place the MCP door shapes what it answers.

- Tools: the episode's tools (shared, task, toolset) with their input
  schemas as declared; the terminal tool with `"ors/terminal": true` in its
  `_meta`.
- Tool results: text blocks → text content, image blocks → image content
  (base64 data, MIME type); a block's `detail` in its `_meta` as
  `"ors/detail"`; the result's `_meta` holds `"ors/finished"`, and
  `"ors/reward"` and `"ors/metadata"` when they are not null (absent means
  null: the 2026-07-28 serialization drops null values, so no revision has them). A refusal, a tool that raised and a failed call are
  results with `isError: true`, their text and `"ors/reason"`.
- The prompt: the handshake's `instructions` are the prompt's text blocks;
  the `task` prompt holds the episode's messages, one MCP message per block
  (MCP speaks `user` and `assistant` only: a system turn is a user message
  whose blocks say `"ors/role": "system"`; reasoning, tool calls and tool
  results are text content holding the block's JSON, `"ors/block"` naming
  its type).
"""

from __future__ import annotations

import base64
import json
from typing import Any, Iterable, Optional

import mcp_types as types

from ors_grpc._generated.ors.v1 import environment_service_pb2 as service_pb2
from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc.protocol import json_text
from ors_grpc.protocol.convert import block_from_proto
from ors_grpc.protocol.enums import RUN_TOOL_ERROR_REASON

__all__ = ["FINISHED_KEY", "REASON_KEY", "REWARD_KEY", "TASK_PROMPT", "TERMINAL_KEY", "failed_call", "instructions",
           "prompt_messages", "refused_call", "tool_result", "tools"]

#: `_meta` keys of the ORS data MCP has no field for.
REWARD_KEY = "ors/reward"
FINISHED_KEY = "ors/finished"
METADATA_KEY = "ors/metadata"
REASON_KEY = "ors/reason"
DETAIL_KEY = "ors/detail"
TERMINAL_KEY = "ors/terminal"
ROLE_KEY = "ors/role"
BLOCK_KEY = "ors/block"

#: The one prompt the door offers: the episode's messages.
TASK_PROMPT = "task"

#: The schema of a tool that takes no input (MCP requires an object schema).
_NO_INPUT = {"type": "object", "properties": {}}

def _json(value: types_pb2.JsonValue, present: bool) -> Any:
    return json.loads(value.json) if present else None


def tools(listing: service_pb2.ListTaskToolsResponse) -> list[types.Tool]:
    """The episode's tools as MCP tools; the terminal tool last, marked in `_meta`."""
    listed = [
        types.Tool(name=spec.name, description=spec.description or None,
                   input_schema=_json(spec.input_schema, spec.HasField("input_schema")) or _NO_INPUT)
        for spec in listing.tools
    ]
    if listing.HasField("terminal_tool"):
        terminal = listing.terminal_tool
        schema = _NO_INPUT
        if terminal.HasField("arg"):
            schema = {"type": "object", "properties": {terminal.arg: {"type": "string"}}, "required": [terminal.arg]}
        listed.append(types.Tool(name=terminal.name, description=terminal.description or None,
                                 input_schema=schema, meta={TERMINAL_KEY: True}))
    return listed


def _content(block: types_pb2.Block | types_pb2.MessageBlock, meta: Optional[dict[str, Any]] = None) -> Any:
    """One ORS block as MCP content (see the module's docstring)."""
    kind = block.WhichOneof("block")
    meta = dict(meta or {})
    if kind in ("text", "image"):
        inner = getattr(block, kind)
        if inner.HasField("detail"):
            meta[DETAIL_KEY] = json.loads(inner.detail.json)
        if kind == "text":
            return types.TextContent(text=inner.text, meta=meta or None)
        return types.ImageContent(data=base64.b64encode(inner.data).decode("ascii"), mime_type=inner.mime_type,
                                  meta=meta or None)
    meta[BLOCK_KEY] = kind
    return types.TextContent(text=json_text.dumps(block_from_proto(block)), meta=meta)


def tool_result(result: types_pb2.RunToolResult) -> types.CallToolResult:
    """A CallTool result: the tool's output, or its refusal (`isError`)."""
    if result.WhichOneof("outcome") == "error":
        return refused_call(result.error, RUN_TOOL_ERROR_REASON.name(result.reason) or "refused")
    output = result.output
    meta: dict[str, Any] = {FINISHED_KEY: output.finished}
    if output.HasField("reward"):
        meta[REWARD_KEY] = output.reward
    metadata = _json(output.metadata, output.HasField("metadata"))
    if metadata is not None:
        meta[METADATA_KEY] = metadata
    return types.CallToolResult(content=[_content(block) for block in output.blocks], is_error=False, meta=meta)


def refused_call(text: str, reason: str) -> types.CallToolResult:
    """A call that did not run (or did not end well): its text, `isError`, and why in `_meta`."""
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True, meta={REASON_KEY: reason})


def failed_call(message: str) -> types.CallToolResult:
    """The tool raised (or timed out): its message."""
    return refused_call(message, "tool_error")


def instructions(prompt: service_pb2.GetPromptResponse) -> str:
    """The prompt's text (its text blocks, in order), for the handshake's `instructions`."""
    return "\n\n".join(block.text.text for block in prompt.blocks if block.WhichOneof("block") == "text")


def prompt_messages(messages: Iterable[types_pb2.Message]) -> list[types.PromptMessage]:
    """The episode's messages as MCP prompt messages: one per block."""
    prompt = []
    for message in messages:
        role = "assistant" if message.role == types_pb2.MESSAGE_ROLE_ASSISTANT else "user"
        meta = {ROLE_KEY: "system"} if message.role == types_pb2.MESSAGE_ROLE_SYSTEM else None
        prompt.extend(types.PromptMessage(role=role, content=_content(block, meta)) for block in message.blocks)
    return prompt
