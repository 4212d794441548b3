"""How a pydantic validation error reads on the wire: one line per wrong field.

    a: Input should be a valid number (got 'x')
    b: Field required

A request body the doors refuse (422/400) and a tool input an environment
refuses (`input_validation`) both read so. The reader is often a language
model correcting its own call: it gets the field, the rule and what it sent,
without pydantic's internals (error types, documentation URLs).
"""

from __future__ import annotations

from typing import Any

import pydantic

__all__ = ["describe_validation_error"]

#: Longest `repr` of a wrong value quoted back (the rest is cut, marked `...`).
MAX_QUOTED_INPUT_CHARS = 80
#: Error types where the input is not the field's value (a missing field's is the whole object).
_NO_INPUT = frozenset({"missing", "extra_forbidden", "model_type", "model_attributes_type", "dataclass_type"})


def describe_validation_error(exc: pydantic.ValidationError, *, quote_input: bool = True) -> str:
    """Each wrong field on a line of its own: `where: what (got VALUE)`; without
    `(got VALUE)` unless `quote_input` (a request body may carry secrets)."""
    return "\n".join(_describe_one(error, quote_input) for error in exc.errors(include_url=False))


def _describe_one(error: Any, quote_input: bool) -> str:
    where = ".".join(str(part) for part in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    if quote_input and error["type"] not in _NO_INPUT and "input" in error:
        message += f" (got {_quoted(error['input'])})"
    return f"{where}: {message}" if where else message


def _quoted(value: Any) -> str:
    text = repr(value)
    if len(text) > MAX_QUOTED_INPUT_CHARS:
        text = text[:MAX_QUOTED_INPUT_CHARS - 3] + "..."
    return text
