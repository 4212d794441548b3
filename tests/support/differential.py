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


#: Why an answer may add specifics (docs/http-bridge.md, "Errors").
SPECIFICS_REASON = "refusals say what is valid after the reference's words (docs/http-bridge.md)"
#: Why a tool input error may differ.
FIELDS_REASON = "tool input errors list the wrong fields one per line, after the reference's words, with the reason"


def _detail(observation: dict) -> str:
    body = observation["body"]
    return body["errors"][0] if "errors" in body else body["detail"]


def adds_specifics(reference: dict, ours: dict) -> bool:
    """The same status and headers; our detail is the reference's words, then what is valid after `: ` or `; `."""
    ref_detail, our_detail = _detail(reference), _detail(ours)
    same_rest = {k: v for k, v in reference.items() if k not in ("body", "text")} == {
        k: v for k, v in ours.items() if k not in ("body", "text")}
    return same_rest and our_detail != ref_detail and any(
        our_detail.startswith(ref_detail + separator) for separator in (": ", "; "))


def lists_the_wrong_fields(*lines: str) -> Check:
    """A refused tool input: the reference's pydantic list, ours `lines` (one per wrong field), with the reason."""
    expected = "Tool input validation error:" + (f" {lines[0]}" if len(lines) == 1 else "".join(f"\n{line}" for line in lines))

    def check(reference: dict, ours: dict) -> bool:
        ref_result, our_result = reference["body"]["result"], ours["body"]["result"]
        rest = {k: v for k, v in our_result.items() if k not in ("error", "reason")}
        return (reference["status"] == ours["status"] and our_result.get("reason") == "input_validation"
                and ref_result["error"].startswith("Tool input validation error: [{")
                and our_result["error"] == expected
                and rest == {k: v for k, v in ref_result.items() if k not in ("error", "reason")})

    return check


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
