"""User JSON as the protocol carries it (`JsonValue { string json }`): the
one place JSON text is made, and the canonical form that keys compare by
(idempotency fingerprints, warm-episode claim keys)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

__all__ = ["canonical", "dumps", "jsonable"]


def jsonable(value: Any) -> Any:
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


def dumps(value: Any) -> str:
    """Compact JSON text of a user value, lossless for JSON-shaped data
    (big integers, `1.0` vs `1`, key order and unicode kept)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=jsonable)


def canonical(value: Any) -> str:
    """`dumps` with keys sorted: equal JSON values give equal text."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=jsonable, sort_keys=True)
