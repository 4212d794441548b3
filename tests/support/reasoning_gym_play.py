"""reasoning-gym environments as served, and what reasoning-gym itself says of the same entries."""

from __future__ import annotations

from typing import Any, Mapping

import reasoning_gym

#: Task families served together by the tests: one dataset each, and one mix.
FAMILIES = ("leg_counting", "basic_arithmetic", "spell_backward", "gcd+chain_sum")
#: The split the tests play: a few entries from seed 5.
SPLIT = "train:4:5"
SERVE_SPEC = "reasoning-gym:" + ",".join(FAMILIES) + f"?split={SPLIT}&split=test:2:9"
WRONG_ANSWER = "not the answer"


def entry(task: Mapping[str, Any]) -> dict[str, Any]:
    """The entry a task spec names, straight from reasoning-gym, and its dataset."""
    dataset = reasoning_gym.create_dataset(task["dataset"], seed=task["seed"], size=task["size"], **task["config"])
    return {"entry": dataset[task["index"]], "dataset": dataset}


def expected_reward(task: Mapping[str, Any], answer: str) -> float:
    """reasoning-gym's own score of `answer` for the task's entry."""
    found = entry(task)
    return float(found["dataset"].score_answer(answer, found["entry"]))
