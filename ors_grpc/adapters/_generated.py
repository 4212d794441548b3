"""What the classes the adapters generate share: a recipe (JSON) that makes the class,
its name and its seeded splits, and the import name a worker process rebuilds the
class from (`module:recipe_...`, through the adapter module's `__getattr__`)."""

from __future__ import annotations

import base64
import json
from typing import Any, Callable, ClassVar

from ors_grpc.authoring.environment import Environment
from ors_grpc.authoring.types import JSONObject

__all__ = ["GeneratedEnvironment", "class_import_name", "generated_class", "rebuilt_class", "recipe_of_import_name"]

#: The start of every generated class's import name (the rest is its recipe).
_RECIPE_PREFIX = "recipe_"


class GeneratedEnvironment(Environment):
    """An environment class made from a recipe with a `name` and `splits`
    (`[NAME, SIZE, SEED]`s); a subclass says what task `index` of a split is."""

    #: Set on each generated class.
    recipe: ClassVar[dict[str, Any]] = {}

    @classmethod
    def name(cls) -> str:
        return cls.recipe["name"]

    @classmethod
    def list_splits(cls) -> list[str]:
        return [name for name, _, _ in cls.recipe["splits"]]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        _, size, seed = cls.split_of(split)
        return [cls.task(index, size, seed) for index in range(size)]

    @classmethod
    async def num_tasks(cls, split: str) -> int:
        return cls.split_of(split)[1]

    @classmethod
    async def get_task(cls, split: str, index: int) -> JSONObject:
        _, size, seed = cls.split_of(split)
        if not 0 <= index < size:
            raise IndexError(index)
        return cls.task(index, size, seed)

    @classmethod
    def split_of(cls, split: str) -> list[Any]:
        """`[NAME, SIZE, SEED]` of the split named `split`."""
        for entry in cls.recipe["splits"]:
            if entry[0] == split:
                return entry
        raise ValueError(f"unknown split {split!r}; splits: {cls.list_splits()}")

    @classmethod
    def task(cls, index: int, size: int, seed: int) -> JSONObject:
        """Task `index` of a split of `size` tasks from `seed`."""
        raise NotImplementedError


def generated_class(base: type[GeneratedEnvironment], recipe: dict[str, Any], module: str, doc: str,
                    name: str | None = None, **attributes: Any) -> type[GeneratedEnvironment]:
    """A subclass of `base` for `recipe` in `module`, importable there under its import name
    (made from `recipe` as given, so that the module rebuilds the same class from it), served
    as `name` (default: the recipe's)."""
    import_name = class_import_name(recipe)
    attributes = {"recipe": {**recipe, "name": name or recipe["name"]}, **attributes, "__module__": module,
                  "__qualname__": import_name, "__doc__": doc}
    return type(import_name, (base,), attributes)


def rebuilt_class(module: str, name: str, build: Callable[[str], type]) -> type:
    """What an adapter module's `__getattr__(name)` answers: the class `build` makes
    from the recipe (JSON) in `name`, or AttributeError for another name."""
    recipe = recipe_of_import_name(name)
    if recipe is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return build(json.dumps(recipe, sort_keys=True))


def class_import_name(recipe: dict[str, Any]) -> str:
    """The attribute name under which an adapter module rebuilds the class of
    `recipe` (its module `__getattr__`), so that a worker process imports it
    as `module:name` like any class: `recipe_` and the recipe's JSON in
    URL-safe base64 (no dots: the worker splits the name at them)."""
    text = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    return _RECIPE_PREFIX + base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def recipe_of_import_name(name: str) -> dict[str, Any] | None:
    """The recipe `class_import_name` made `name` from, or None for another name."""
    if not name.startswith(_RECIPE_PREFIX):
        return None
    encoded = name[len(_RECIPE_PREFIX):]
    try:
        return json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    except ValueError:
        return None

