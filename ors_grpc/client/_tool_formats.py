"""Tool specs in the shapes LLM providers' function-calling APIs expect.

The shapes and the schema clean-ups are those of ors-sdk 0.1.0's
`ors.client.environment.convert_tool_response`, so a trainer switching from
that client gets the same dicts.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Sequence, Union

from ors_grpc.authoring.types import ToolSpec

Provider = Literal["openai", "anthropic", "google", "openrouter"]

_GOOGLE_UNSUPPORTED_SCHEMA_KEYS = {
    "additionalProperties", "additional_properties", "title", "default", "examples",
    "example", "patternProperties", "oneOf", "allOf", "anyOf", "not",
}
_OPENAI_UNSUPPORTED_SCHEMA_KEYS = {"additionalProperties", "patternProperties", "oneOf", "allOf", "anyOf", "not"}


def _sanitize_google_schema(value: Any) -> Any:
    """Drop the schema keys Gemini function calling rejects; `$ref`/`$defs` lose their `$`."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in _GOOGLE_UNSUPPORTED_SCHEMA_KEYS:
                continue
            key = {"$ref": "ref", "$defs": "defs"}.get(key, key)
            out[key] = _sanitize_google_schema(item)
        return out
    if isinstance(value, list):
        return [_sanitize_google_schema(item) for item in value]
    return value


def _first_alternative(value: dict[str, Any]) -> Optional[Any]:
    """OpenAI takes no unions: keep the first non-null `anyOf` option, or the first `oneOf`/`allOf` one."""
    options = value.get("anyOf")
    if options is not None:
        for option in options:
            if not (isinstance(option, dict) and option.get("type") == "null"):
                return option
        if options:
            return options[0]
    for key in ("oneOf", "allOf"):
        if value.get(key):
            return value[key][0]
    return None


def _sanitize_openai_schema(value: Any) -> Any:
    if isinstance(value, dict):
        alternative = _first_alternative(value)
        if alternative is not None:
            return _sanitize_openai_schema(alternative)
        out = {
            key: _sanitize_openai_schema(item)
            for key, item in value.items()
            if key not in _OPENAI_UNSUPPORTED_SCHEMA_KEYS
        }
        if out.get("type") == "array" and "items" not in out:
            out["items"] = {}
        return out
    if isinstance(value, list):
        return [_sanitize_openai_schema(item) for item in value]
    return value


def _strip_titles(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _strip_titles(item) for key, item in value.items() if key != "title"}
    if isinstance(value, list):
        return [_strip_titles(item) for item in value]
    return value


def _name_and_description(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description}


def _schema(spec: ToolSpec) -> Optional[Any]:
    return _strip_titles(spec.input_schema) if spec.input_schema else None


def _openai(spec: ToolSpec) -> dict[str, Any]:
    schema = _schema(spec)
    return {
        "type": "function",
        **_name_and_description(spec),
        "parameters": _sanitize_openai_schema(schema) if schema else None,
    }


def _openrouter(spec: ToolSpec) -> dict[str, Any]:
    schema = _schema(spec)
    return {
        "type": "function",
        "function": _name_and_description(spec),
        "parameters": _sanitize_openai_schema(schema) if schema else None,
    }


def _anthropic(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "custom",
        **_name_and_description(spec),
        "input_schema": _schema(spec) or {"type": "object", "properties": {}},
    }


def _google(spec: ToolSpec) -> dict[str, Any]:
    schema = _schema(spec)
    return {**_name_and_description(spec), "parameters": _sanitize_google_schema(schema) if schema else None}


_CONVERTERS = {"openai": _openai, "openrouter": _openrouter, "anthropic": _anthropic, "google": _google}


def format_tools(
    specs: Sequence[ToolSpec], format: Optional[Provider] = None
) -> Union[list[ToolSpec], list[dict[str, Any]]]:
    """The specs themselves when `format` is None, else the provider's dicts."""
    if format is None:
        return list(specs)
    try:
        convert = _CONVERTERS[format]
    except KeyError:
        raise ValueError(f"Invalid format: {format!r}") from None
    return [convert(spec) for spec in specs]
