"""How the server runs an environment's code beyond its session hooks: task
lookups and tool functions, each through `user_code.run_user_code` (so that
slow synchronous code never stalls the event loop).

`Environment`'s own defaults of `num_tasks`, `get_task` and `get_task_range`
simply await `list_tasks` in the caller's thread, which is right for an
author calling them; when a class keeps a default, the server does the same
work here instead, with `list_tasks` run where `run_user_code` puts it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional

from ors_grpc._runtime.user_code import run_user_code
from ors_grpc.authoring.environment import Environment, overrides, task_slice, tool_argument, tool_result
from ors_grpc.authoring.types import JSONObject, RunToolOutput

__all__ = ["get_task", "get_task_range", "list_tasks", "num_tasks", "run_tool"]

#: Task counts of the classes that keep the default `num_tasks`, by class and split.
_NUM_TASKS: dict[tuple[type, str], int] = {}


async def list_tasks(env_cls: type[Environment], split: str) -> Any:
    return await run_user_code(env_cls.list_tasks, split, on_loop=env_cls.sync_code_on_loop)


async def num_tasks(env_cls: type[Environment], split: str) -> int:
    """The number of tasks of a split (the default's: cached per class and split)."""
    if overrides(env_cls, "num_tasks"):
        return await run_user_code(env_cls.num_tasks, split, on_loop=env_cls.sync_code_on_loop)
    key = (env_cls, split)
    if key not in _NUM_TASKS:
        _NUM_TASKS[key] = len(await list_tasks(env_cls, split))
    return _NUM_TASKS[key]


async def get_task(env_cls: type[Environment], split: str, index: int) -> JSONObject:
    """Task `index` of a split (IndexError when out of range)."""
    if overrides(env_cls, "get_task"):
        return await run_user_code(env_cls.get_task, split, index, on_loop=env_cls.sync_code_on_loop)
    return (await list_tasks(env_cls, split))[index]


async def get_task_range(
    env_cls: type[Environment], split: str, start: Optional[int], stop: Optional[int]
) -> list[JSONObject]:
    """Tasks in [start, stop) of a split, with Python slice conventions."""
    if overrides(env_cls, "get_task_range"):
        return await run_user_code(env_cls.get_task_range, split, start, stop, on_loop=env_cls.sync_code_on_loop)
    return [await get_task(env_cls, split, i) for i in task_slice(await num_tasks(env_cls, split), start, stop)]


async def run_tool(
    env: Environment, name: str, fn: Callable[..., Any], tool_input: JSONObject, *, sync_lock: asyncio.Lock
) -> RunToolOutput:
    """Validate `tool_input` for tool function `fn` and run it; invalid input
    is a refusal (input_validation), exceptions of the tool propagate."""
    args = tool_argument(fn, tool_input)
    if isinstance(args, RunToolOutput):
        return args
    return tool_result(name, await run_user_code(fn, *args, sync_lock=sync_lock, on_loop=env.sync_code_on_loop))
