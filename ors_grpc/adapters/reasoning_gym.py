"""reasoning-gym's datasets as ORS environments (the `reasoning-gym` extra).

    ors-grpc serve 'reasoning-gym:leg_counting,basic_arithmetic?split=train:1000:0&split=test:100:1'

Each environment's tasks are a dataset's entries: a task spec names the
dataset, its configuration, seed and size and the entry's index, and
recreates the entry (`reasoning_gym.create_dataset(...)[index]`). The prompt
is the entry's question; the one tool, `submit`, is the terminal tool: it
answers the dataset's `score_answer` for the answer as the reward and ends
the episode. `a+b` mixes datasets into one environment (reasoning-gym's
composite dataset, equal weights; `composite()` takes weights). Any other
option is the datasets' configuration (their difficulty parameters).
docs/ecosystems.md has the rest."""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping, Sequence

import reasoning_gym
from pydantic import BaseModel, Field
from reasoning_gym.composite import DatasetSpec

from ors_grpc.adapters._generated import GeneratedEnvironment, generated_class, rebuilt_class
from ors_grpc.adapters._sources import SeededSplit, check_splits, parse_source_spec
from ors_grpc.authoring.environment import Environment, terminal, tool
from ors_grpc.authoring.types import JSONObject, TextBlock, ToolOutput

__all__ = ["DEFAULT_SPLITS", "Answer", "composite", "environment", "environments_from_spec"]

#: Splits when none are given: `train`, 1000 entries from seed 0; `test`, 100 from seed 1.
DEFAULT_SPLITS = (SeededSplit("train", 1000, 0), SeededSplit("test", 100, 1))
#: Datasets kept built, by (name, configuration, seed, size): building one may take a while.
_DATASET_CACHE_SIZE = 256


class Answer(BaseModel):
    answer: str = Field(description="Your final answer, exactly as the question asks for it.")


def environment(dataset: str, *, config: Mapping[str, Any] | None = None,
                splits: Sequence[SeededSplit] = DEFAULT_SPLITS, name: str | None = None) -> type[Environment]:
    """The environment of one dataset (`config`: its configuration, without seed and size)."""
    return composite({dataset: 1.0}, configs={dataset: dict(config or {})}, splits=splits, name=name)


def composite(weights: Mapping[str, float], *, configs: Mapping[str, Mapping[str, Any]] | None = None,
              splits: Sequence[SeededSplit] = DEFAULT_SPLITS, name: str | None = None) -> type[Environment]:
    """The environment of several datasets mixed by weight (reasoning-gym's composite
    dataset); with one dataset, that dataset's environment. Named `a+b` unless `name`."""
    configs = configs or {}
    unknown = set(configs) - set(weights)
    if unknown:
        raise ValueError(f"configuration for datasets not mixed in: {sorted(unknown)}")
    parts = [[dataset, float(weight), dict(configs.get(dataset, {}))] for dataset, weight in weights.items()]
    recipe = {
        "name": name or "+".join(weights),
        "parts": parts,
        "splits": [split.as_json() for split in check_splits(splits)],
    }
    return _environment_class(json.dumps(recipe, sort_keys=True))


def environments_from_spec(text: str) -> list[type[Environment]]:
    """`ors-grpc serve reasoning-gym:TEXT` (the entry point): `NAME[+NAME...][,...]`
    and options `split=NAME:SIZE:SEED` (repeatable) and the datasets' configuration."""
    spec = parse_source_spec(text)
    splits = spec.splits or DEFAULT_SPLITS
    found = []
    for group in spec.target.split(","):
        datasets = [name.strip() for name in group.split("+")]
        if not all(datasets) or len(set(datasets)) != len(datasets):
            raise ValueError(f"reasoning-gym:{text}: cannot read the datasets of {group!r}")
        found.append(composite(dict.fromkeys(datasets, 1.0),
                               configs={dataset: spec.options for dataset in datasets}, splits=splits))
    return found


def __getattr__(name: str) -> Any:
    """A generated environment class, rebuilt from its import name (in a worker process)."""
    return rebuilt_class(__name__, name, _environment_class)


# --- the datasets --------------------------------------------------------------

@functools.lru_cache(maxsize=_DATASET_CACHE_SIZE)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


@functools.lru_cache(maxsize=_DATASET_CACHE_SIZE)
def _mixed(parts_json: str, seed: int, size: int) -> Any:
    specs = [DatasetSpec(name=name, weight=weight, config=config) for name, weight, config in json.loads(parts_json)]
    return reasoning_gym.create_dataset("composite", seed=seed, size=size, datasets=specs)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def task_entry(task: Mapping[str, Any]) -> dict[str, Any]:
    """The entry a task spec names, and the dataset that scores it."""
    try:
        dataset = _dataset(task["dataset"], _canonical(task.get("config", {})), task["seed"], task["size"])
        index = task["index"]
    except KeyError as missing:
        raise ValueError(f"a reasoning-gym task names dataset, config, seed, size and index; {missing} is missing") from None
    if not (isinstance(index, int) and 0 <= index < len(dataset)):
        raise IndexError(f"index {index!r} is outside the dataset's {len(dataset)} entries")
    return {"entry": dataset[index], "dataset": dataset}


# --- the environment -----------------------------------------------------------

class _ReasoningGymEnvironment(GeneratedEnvironment):
    """One entry of a reasoning-gym dataset: its question, and `submit` scored by the dataset."""

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        served = {dataset: config for dataset, _, config in self.recipe["parts"]}
        if task_spec.get("dataset") not in served or task_spec.get("config", {}) != served[task_spec["dataset"]]:
            raise ValueError(f"{self.name()} serves entries of {sorted(served)} with their configuration "
                             f"{list(served.values())}, not {task_spec.get('dataset')!r} with {task_spec.get('config')}")
        found = task_entry(task_spec)
        self.entry, self.dataset = found["entry"], found["dataset"]

    @classmethod
    def task(cls, index: int, size: int, seed: int) -> JSONObject:
        """The entry's own dataset, seed, size and index (for a mix, those of the dataset
        the mix drew it from)."""
        parts = cls.recipe["parts"]
        if len(parts) == 1:
            dataset, _, config = parts[0]
            return {"dataset": dataset, "config": config, "seed": seed, "size": size, "index": index}
        mix = _mixed(_canonical(parts), seed, size)
        source = mix[index]["metadata"]["source_dataset"]
        drawn_from = mix.datasets[source]
        config = next(config for dataset, _, config in parts if dataset == source)
        return {"dataset": source, "config": config, "seed": drawn_from.seed, "size": drawn_from.size, "index": index}

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=self.entry["question"])]

    @terminal
    @tool
    def submit(self, args: Answer) -> ToolOutput:
        """Submit your final answer; it is scored and the episode ends."""
        score = float(self.dataset.score_answer(args.answer, self.entry))
        return ToolOutput(blocks=[TextBlock(text=f"score: {score:g}")], metadata={"score": score},
                          reward=score, finished=True)


@functools.cache
def _environment_class(recipe_json: str) -> type[Environment]:
    recipe = json.loads(recipe_json)
    for dataset, weight, config in recipe["parts"]:
        if weight < 0:
            raise ValueError(f"dataset {dataset!r}: weight {weight} is negative")
        # Build once now: an unknown dataset or configuration fails here, not in an episode.
        try:
            _dataset(dataset, _canonical(config), 0, 1)
        except (TypeError, ValueError, AssertionError) as exc:
            raise ValueError(f"reasoning-gym dataset {dataset!r} with configuration {config}: {exc}") from None
    return generated_class(_ReasoningGymEnvironment, recipe, __name__, f"reasoning-gym: {recipe['name']}")
