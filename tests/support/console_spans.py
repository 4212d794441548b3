"""Spans that OpenTelemetry's ConsoleSpanExporter printed from a served
process (`OTEL_TRACES_EXPORTER=console`), and the shape of one call's trace."""

from __future__ import annotations

import json
from typing import Any

CALL_TOOL = "ors.v1.EnvironmentService/CallTool"


def console_spans(lines: list[str]) -> list[dict[str, Any]]:
    """The spans a ConsoleSpanExporter printed (JSON objects, one after another, between log lines
    that may hold braces too: `/{env}/mcp/{session_id}`)."""
    text = "\n".join(lines)
    decoder, spans, at = json.JSONDecoder(), [], 0
    while (start := text.find("{", at)) != -1:
        try:
            span, at = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            at = start + 1
            continue
        if isinstance(span, dict) and "context" in span:
            spans.append(span)
    return spans


def drain(process: Any) -> list[str]:
    lines = []
    while (line := process.lines.get(timeout=30)) is not None:
        lines.append(line)
    return lines


def assert_one_call_trace(door_span: dict[str, Any], backend_spans: list[dict[str, Any]], trace_id: str,
                          parent_id: str) -> dict[str, Any]:
    """The door's span continues the client's `parent_id` in `trace_id`, the CallTool RPC's span is its
    child and the tool call's is the RPC's (console exporter spans); returns the RPC's span."""
    rpc_span = next(span for span in backend_spans if span["name"] == CALL_TOOL)
    tool_span = next(span for span in backend_spans if span["name"] == "execute_tool echo")
    assert door_span["context"]["trace_id"] == rpc_span["context"]["trace_id"] == f"0x{trace_id}"
    assert door_span["parent_id"] == f"0x{parent_id}"
    assert rpc_span["parent_id"] == door_span["context"]["span_id"]
    assert tool_span["parent_id"] == rpc_span["context"]["span_id"]
    return rpc_span
