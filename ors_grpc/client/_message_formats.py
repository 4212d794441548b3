"""Conversations (`Message` lists) in the shapes LLM providers' APIs expect.

The shapes are those of openreward's client (`get_messages(format=...)`,
openreward >= 0.1.157), so a trainer switching from it gets the same dicts:

- None: the messages themselves.
- "openai" / "openrouter": a chat-completions message list. Tool calls go to
  the assistant message's `tool_calls`, reasoning to its `reasoning_content`;
  each tool result becomes a `role: "tool"` message (text only).
- "anthropic": `{"system", "messages"}`: leading system text hoisted, blocks
  mapped natively (thinking, tool_use, tool_result first in a user turn).
- "google": `{"system_instruction", "contents"}`: the assistant is `model`,
  tool calls and results are function_call / function_response parts (a
  result addressed by its call's function name); reasoning has no form there.

What a format cannot carry raises ValueError rather than being dropped.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional, Sequence, Union

from ors_grpc.authoring.types import ImageBlock, Message, TextBlock
from ors_grpc.client._tool_formats import Provider

__all__ = ["format_messages"]


def _tool_result_text(block: Any, format: str) -> str:
    """A tool result's content as one text (formats whose tool messages are text-only)."""
    if any(isinstance(inner, ImageBlock) for inner in block.blocks):
        raise ValueError(
            f"format={format!r} cannot carry images inside tool results "
            f'(tool messages are text-only there); use format="anthropic" or format=None.'
        )
    return "\n".join(inner.text for inner in block.blocks)


def _hoisted_system(messages: Sequence[Message], provider: str) -> tuple[Optional[str], list[Message]]:
    """The leading system messages' text (None without any), and the other messages."""
    texts: list[str] = []
    rest: list[Message] = []
    for message in messages:
        if message.role != "system":
            rest.append(message)
            continue
        if rest:
            raise ValueError(
                f"{provider} cannot represent a system message after the first "
                f"non-system turn; move it to the start of the conversation."
            )
        if not all(isinstance(block, TextBlock) for block in message.blocks):
            raise ValueError(f"{provider} system messages must be text-only.")
        texts.extend(block.text for block in message.blocks)
    return ("\n\n".join(texts) if texts else None), rest


def _openai_content(blocks: Sequence[Any]) -> Union[str, list[dict[str, Any]]]:
    """One text block as a plain string, anything else as content parts."""
    if len(blocks) == 1 and isinstance(blocks[0], TextBlock):
        return blocks[0].text
    return [
        {"type": "text", "text": block.text} if isinstance(block, TextBlock)
        else {"type": "image_url", "image_url": {"url": f"data:{block.mimeType};base64,{block.data}"}}
        for block in blocks
    ]


def _openai_assistant(message: Message) -> dict[str, Any]:
    visible = [b for b in message.blocks if b.type in ("text", "image")]
    entry: dict[str, Any] = {"role": "assistant", "content": _openai_content(visible) if visible else None}
    reasoning = [b.text for b in message.blocks if b.type == "reasoning"]
    if reasoning:
        entry["reasoning_content"] = "\n\n".join(reasoning)
    calls = [
        {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(dict(b.input))}}
        for b in message.blocks if b.type == "tool_call"
    ]
    if calls:
        entry["tool_calls"] = calls
    return entry


def _openai(messages: Sequence[Message], format: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "assistant":
            out.append(_openai_assistant(message))
        elif message.role == "user":
            rest = []
            for block in message.blocks:
                if block.type == "tool_result":
                    out.append({"role": "tool", "tool_call_id": block.tool_call_id,
                                "content": _tool_result_text(block, format)})
                else:
                    rest.append(block)
            if rest:
                out.append({"role": "user", "content": _openai_content(rest)})
        else:
            out.append({"role": message.role, "content": _openai_content(list(message.blocks))})
    return out


def _anthropic_image(block: ImageBlock) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": block.mimeType, "data": block.data}}


def _anthropic_block(block: Any) -> dict[str, Any]:
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "image":
        return _anthropic_image(block)
    if block.type == "reasoning":
        thinking = {"type": "thinking", "thinking": block.text}
        if block.signature:
            thinking["signature"] = block.signature
        return thinking
    if block.type == "tool_call":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": dict(block.input)}
    result: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": block.tool_call_id,
        "content": [_anthropic_image(b) if isinstance(b, ImageBlock) else {"type": "text", "text": b.text}
                    for b in block.blocks],
    }
    if block.is_error:
        result["is_error"] = True
    return result


def _anthropic(messages: Sequence[Message], format: str) -> dict[str, Any]:
    system, rest = _hoisted_system(messages, "anthropic")
    out = []
    for message in rest:
        # Anthropic wants tool results first in a user turn; the rest keep their order.
        blocks = sorted(message.blocks, key=lambda b: b.type != "tool_result")
        out.append({"role": message.role, "content": [_anthropic_block(b) for b in blocks]})
    return {"system": system, "messages": out}


def _google_part(block: Any, call_names: dict[str, str], format: str) -> dict[str, Any]:
    if block.type == "text":
        return {"text": block.text}
    if block.type == "image":
        return {"inline_data": {"mime_type": block.mimeType, "data": block.data}}
    if block.type == "reasoning":
        raise ValueError(
            'format="google" has no input representation for reasoning blocks; '
            'use format=None or format="anthropic".'
        )
    if block.type == "tool_call":
        return {"function_call": {"name": block.name, "args": dict(block.input)}}
    name = call_names.get(block.tool_call_id)
    if name is None:
        raise ValueError(
            f"tool_result {block.tool_call_id!r} has no matching tool_call in the "
            f'conversation; format="google" addresses results by function name.'
        )
    return {"function_response": {"name": name, "response": {"output": _tool_result_text(block, format)}}}


def _google(messages: Sequence[Message], format: str) -> dict[str, Any]:
    call_names = {b.id: b.name for m in messages for b in m.blocks if b.type == "tool_call"}
    system, rest = _hoisted_system(messages, "google")
    contents = [
        {"role": "model" if m.role == "assistant" else "user",
         "parts": [_google_part(b, call_names, format) for b in m.blocks]}
        for m in rest
    ]
    return {"system_instruction": system, "contents": contents}


_CONVERTERS: dict[str, Callable[[Sequence[Message], str], Any]] = {
    "openai": _openai, "openrouter": _openai, "anthropic": _anthropic, "google": _google,
}


def format_messages(
    messages: Sequence[Message], format: Optional[Provider] = None
) -> Union[list[Message], list[dict[str, Any]], dict[str, Any]]:
    """The messages themselves when `format` is None, else the provider's shape."""
    if format is None:
        return list(messages)
    try:
        convert = _CONVERTERS[format]
    except KeyError:
        raise ValueError(f"Invalid format: {format!r}") from None
    return convert(list(messages), format)
