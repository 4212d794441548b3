"""How an adapter reads its `ors-grpc serve SOURCE:SPEC`: `TARGET?OPTIONS`, and
splits of a size and a seed."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from urllib.parse import parse_qsl

__all__ = ["SeededSplit", "SourceSpec", "check_splits", "parse_source_spec"]


@dataclass(frozen=True)
class SeededSplit:
    """A split of `size` tasks, task `i` made from seed `seed` (and index `i`)."""

    name: str
    size: int
    seed: int

    @classmethod
    def parse(cls, text: str) -> SeededSplit:
        """`NAME:SIZE:SEED` (the `split=` option)."""
        parts = text.split(":")
        if len(parts) != 3:
            raise ValueError(f"split must look like NAME:SIZE:SEED, got {text!r}")
        name, size, seed = parts
        try:
            split = cls(name, int(size), int(seed))
        except ValueError:
            raise ValueError(f"split {text!r}: SIZE and SEED must be integers") from None
        if not name or split.size < 1 or split.seed < 0:
            raise ValueError(f"split {text!r}: needs a name, a SIZE of at least 1 and a SEED of 0 or more")
        return split

    def as_json(self) -> list[Any]:
        return [self.name, self.size, self.seed]


def check_splits(splits: Sequence[SeededSplit]) -> tuple[SeededSplit, ...]:
    names = [split.name for split in splits]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"splits need distinct names, at least one: {names}")
    return tuple(splits)


@dataclass(frozen=True)
class SourceSpec:
    """`ors-grpc serve SOURCE:TARGET?OPTIONS` after `SOURCE:`: the target, the
    `split=` options and the others (values parsed as JSON where they parse)."""

    target: str
    splits: tuple[SeededSplit, ...] | None
    options: dict[str, Any]

    def take(self, key: str, parse: Callable[[Any], Any] = lambda value: value, default: Any = None) -> Any:
        """Option `key` (removed from `options`), parsed, or `default`."""
        return parse(self.options.pop(key)) if key in self.options else default


def parse_source_spec(text: str) -> SourceSpec:
    """`TARGET[?KEY=VALUE&...]`; `split=NAME:SIZE:SEED` may repeat, any other key may not."""
    target, _, query = text.partition("?")
    if not target:
        raise ValueError(f"nothing to serve in {text!r}")
    splits: list[SeededSplit] = []
    options: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key == "split":
            splits.append(SeededSplit.parse(value))
        elif key in options:
            raise ValueError(f"option {key!r} given twice in {text!r}")
        else:
            options[key] = _option_value(value)
    return SourceSpec(target, check_splits(splits) if splits else None, options)


def _option_value(text: str) -> Any:
    """`3` is 3, `0.5` 0.5, `true` True, `[1,2]` a list; anything else the text itself."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, float) and not math.isfinite(value):
        return text
    return value
