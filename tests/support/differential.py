"""What both differential tests share: a scripted HTTP step, how an answer
is observed (SSE bodies joined, random ids dropped), and the comparison of
the reference's answer with ours."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from tests.support.bridge_http import parse_sse

SSE = {"Accept": "text/event-stream"}


@dataclass(frozen=True)
class Step:
    """One HTTP request of the scenario."""

    name: str
    method: str
    path: str
    body: Any = None  # a JSON value, or bytes sent as is
    sid: Optional[str] = None
    headers: dict[str, str] = field(default_factory=dict)


Check = Callable[[dict, dict], bool]


def canonical(observation: dict) -> str:
    """Exact JSON text: keeps int vs float and key order, unlike ==."""
    return json.dumps(observation, ensure_ascii=False)


def observe_sse(text: str) -> dict:
    """An SSE body with random task ids removed and `chunk`*/`end` joined."""
    stream = parse_sse(text)
    payload = "".join(data for name, data in stream.events if name in ("chunk", "end"))
    return {
        "events": stream.names(),
        "result": json.loads(payload) if payload else None,
        "errors": [data for name, data in stream.events if name == "error"],
    }


def assert_exceptions_name_real_steps(scenario: list[Step], exceptions: dict[str, tuple[str, Check]]) -> None:
    names = [step.name for step in scenario]
    assert len(names) == len(set(names))
    assert set(exceptions) <= set(names)


def assert_same_answer(observations: tuple[dict, dict], step: Step, exceptions: dict[str, tuple[str, Check]],
                       reference_name: str = "reference") -> None:
    """The step's answers from (the reference server, ours) are identical, or pass the check of its exception."""
    reference, ours = (side[step.name] for side in observations)
    if step.name in exceptions:
        reason, check = exceptions[step.name]
        assert check(reference, ours), f"{reason}\n{reference_name}: {reference}\nours: {ours}"
    else:
        assert canonical(ours) == canonical(reference)
