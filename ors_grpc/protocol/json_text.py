"""User JSON as the protocol carries it (`JsonValue { string json }`): the
one place JSON text is made and read, its rules, and the canonical form that
keys compare by (idempotency fingerprints, warm-episode claim keys).

The rules, the same on every door and both ways (`loads` for what arrives,
`dumps` for what is sent): at most `MAX_JSON_DEPTH` levels of objects and
arrays, and only numbers JSON can write (RFC 8259: no NaN, no Infinity,
which Python's json reads and writes by default). A value that breaks one
raises `JsonLimitError` naming the field and where in it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Iterator

from pydantic import BaseModel

from ors_grpc.protocol.constants import MAX_JSON_DEPTH

__all__ = ["JsonLimitError", "canonical", "check", "dumps", "jsonable", "loads"]

_TOO_DEEP = f"nested too deeply (a JSON value may nest at most {MAX_JSON_DEPTH} levels of objects and arrays)"
_NOT_A_NUMBER = "not a JSON number (NaN and Infinity are not JSON, RFC 8259)"
#: Path segments an error names before it elides the rest (keys cut to KEY_SHOWN characters).
PATH_SHOWN, KEY_SHOWN = 4, 32


class JsonLimitError(ValueError):
    """A JSON value over the protocol's rules (too deep, or a non-finite
    number); the message names the field and where in it."""


def _children(item: Any) -> Iterator[tuple[Any, Any]]:
    return iter(item.items()) if isinstance(item, dict) else enumerate(item)


def _violation(value: Any, max_depth: int) -> tuple[tuple[Any, ...], str] | None:
    """The path to the first place over the rules and what is wrong there,
    or None. Iterative: a value nested 100,000 deep costs no recursion."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 0, ())]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth >= max_depth:
                return path, _TOO_DEEP
            stack.extend((child, depth + 1, (*path, key)) for key, child in _children(item))
        elif isinstance(item, float) and not math.isfinite(item):
            return path, _NOT_A_NUMBER
    return None


def _within_rules(value: Any, max_depth: int) -> bool:
    """`_violation(...) is None`, without building paths (the common case)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, (dict, list, tuple)):
                if depth + 1 >= max_depth:
                    return False
                stack.append((child, depth + 1))
            elif isinstance(child, float) and not math.isfinite(child):
                return False
    return True


def _where(field: str, path: tuple[Any, ...]) -> str:
    shown = "".join(f"[{key}]" if isinstance(key, int) else f".{str(key)[:KEY_SHOWN]}" for key in path[:PATH_SHOWN])
    return f"{field}{shown}{'...' if len(path) > PATH_SHOWN else ''}"


def check(value: Any, field: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`value` if it keeps the rules (see the module's doc), else JsonLimitError naming `field`."""
    if isinstance(value, (dict, list, tuple)):
        if _within_rules(value, max_depth):
            return value
    elif not (isinstance(value, float) and not math.isfinite(value)):
        return value
    found = _violation(value, max_depth)
    assert found is not None
    path, problem = found
    raise JsonLimitError(f"{_where(field, path)}: {problem}")


class _NonFinite(ValueError):
    """Raised by the parser's hooks at a number JSON cannot write."""


def _refuse_constant(name: str) -> float:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf or nan: a literal too large for a float (1e999)
        raise _NonFinite(text)
    return value


#: A parser that refuses what JSON cannot write, made once (`json.loads` with hooks makes one per call).
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


_SCAN = _DECODER.scan_once
_OPENINGS, _BYTE_OPENINGS = ("{", "["), (b"{", b"[")
_JSON_SPACE = " \t\n\r"


def _parse(text: str | bytes) -> Any:
    """`json.loads(text)` (bytes in any UTF of JSON, a BOM refused alike), through `_DECODER`.

    The common text, an object or array from its first character (bytes:
    UTF-8 by `json.detect_encoding`'s rule, a second byte that is not 0), is
    scanned at once; any other, and any error, takes `json`'s own path, whose
    errors are the ones raised."""
    if type(text) is bytes and text[:1] in _BYTE_OPENINGS and text[1:2] != b"\0":
        text = text.decode("utf-8", "surrogatepass")
    if type(text) is str and text[:1] in _OPENINGS:
        try:
            value, end = _SCAN(text, 0)
        except StopIteration:
            pass  # not JSON: decode() below says where
        else:
            if end == len(text) or not text[end:].strip(_JSON_SPACE):
                return value
    if isinstance(text, (bytes, bytearray)):
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    elif not isinstance(text, str) or text.startswith("\ufeff"):
        return json.loads(text)  # its errors (a BOM, not text)
    return _DECODER.decode(text)


def _may_nest_deeper(text: str | bytes, max_depth: int) -> bool:
    """Whether `text` holds more than `max_depth` brackets that open (inside
    strings too): only then can it nest deeper, and the value is walked."""
    if isinstance(text, str):
        return text.count("[") + text.count("{") > max_depth
    return text.count(b"[") + text.count(b"{") > max_depth


def loads(text: str | bytes, field: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON text that must keep the rules: ValueError when it is not
    JSON, JsonLimitError (a ValueError) when it breaks a rule, naming `field`.

    The parser itself refuses non-finite numbers (its hooks), and the value
    is walked for its depth only when the text has enough brackets to nest
    that deep: most texts cost one parse and two counts."""
    try:
        value = _parse(text)
    except RecursionError:  # deeper than the parser's recursion limit, so far over ours
        raise JsonLimitError(f"{field}: {_TOO_DEEP}") from None
    except _NonFinite:  # parsed again as Python reads it, for the path to the number
        return check(json.loads(text), field, max_depth)
    if _may_nest_deeper(text, max_depth):
        return check(value, field, max_depth)
    return value


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


#: `dumps`'s encoder, made once: json's C encoder itself where there is one
#: (`json.dumps` makes one per call, through two Python methods); without
#: the check for circular references, so that it can be shared (a cycle
#: nests without end: JsonLimitError, as anything too deep).
_C_ENCODER = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None, jsonable, json.encoder.encode_basestring, None, ":", ",", False, False, False)
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=jsonable, allow_nan=False,
                            check_circular=False)


def _encode(value: Any) -> str:
    if _C_ENCODER is None:
        return _ENCODER.encode(value)
    return "".join(_C_ENCODER(value, 0))


def dumps(value: Any, field: str = "the value") -> str:
    """Compact JSON text of a user value, lossless for JSON-shaped data
    (big integers, `1.0` vs `1`, key order and unicode kept); JsonLimitError
    naming `field` when it breaks a rule (NaN is refused by the encoder, the
    depth checked on what it writes)."""
    try:
        text = _encode(value)
    except RecursionError:
        raise JsonLimitError(f"{field}: {_TOO_DEEP}") from None
    except ValueError as exc:
        if "JSON compliant" not in str(exc):  # the encoder's words for NaN and Infinity
            raise
        raise JsonLimitError(f"{field}: not a JSON number (NaN and Infinity are not JSON, RFC 8259)") from None
    if len(text) > 2 * MAX_JSON_DEPTH:  # a shorter text cannot nest that deep
        check(value, field)  # (pydantic models inside count as one level)
    return text


def canonical(value: Any) -> str:
    """`dumps` with keys sorted: equal JSON values give equal text."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=jsonable, sort_keys=True)
