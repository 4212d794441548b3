"""Hosts that run environments' code in the server's own process: on its
event loop or in a user-code thread, as `user_code.run_user_code` places each
function (the environment's `sync_code_on_loop`, else each function earns
its place). The first implementation of `environment_host`.

An episode's synchronous code runs one call at a time (its `sync_lock`), as
under the reference SDK, where it all runs on the loop.

`Environment`'s own defaults of `num_tasks`, `get_task` and
`get_task_range` simply await `list_tasks` in the caller's thread, which is
right for an author calling them; when a class keeps a default, the catalog
host does the same work instead, with `list_tasks` run where
`run_user_code` puts it.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Awaitable, Callable, Optional, Sequence, Union

from ors_grpc._runtime.environment_host import CatalogHost, EpisodeHost, EpisodeState, HostFactory
from ors_grpc._runtime.user_code import run_user_code, runs_in_thread
from ors_grpc.authoring.environment import (
    Environment, ToolMarks, find_terminal_tool, marks_of, overrides, resolve_tool, task_slice, tool_argument,
    tool_result, tool_specs_of,
)
from ors_grpc.authoring.types import GroupCandidate, JSONObject, ListToolsOutput, RunToolOutput

__all__ = ["LocalCatalogHost", "LocalEpisodeHost", "LocalHosts"]

#: Task counts of the classes that keep the default `num_tasks`, by class and split.
_NUM_TASKS: dict[tuple[type, str], int] = {}

# An episode's `setup()` and `teardown()`: each runs once, in this order.
_NOT_SET_UP, _SET_UP, _TORN_DOWN = 0, 1, 2


class LocalEpisodeHost(EpisodeHost):
    """One episode's environment, in this process."""

    # Slots: an idle episode's memory counts (thousands of them per server).
    __slots__ = ("sync_lock", "env", "toolset", "_in_thread", "_setup_progress", "_resolved")

    def __init__(self, env_cls: type[Environment]) -> None:
        super().__init__(env_cls)
        #: Keeps the episode's synchronous code to one call at a time.
        self.sync_lock = asyncio.Lock()
        self.env: Environment | None = None
        #: The episode's session toolset (attached by name at creation).
        self.toolset: Any = None
        # True while a lifecycle step runs sync code in a user-code thread, which cannot be interrupted.
        self._in_thread = False
        self._setup_progress = _NOT_SET_UP
        #: The tool `tool_marks` resolved last, by name, for the `run_tool` that follows.
        self._resolved: tuple[str, Callable[..., Any]] | None = None

    @property
    def uninterruptible(self) -> bool:
        return self._in_thread

    @property
    def set_up(self) -> bool:
        return self._setup_progress != _NOT_SET_UP

    async def _lifecycle_step(self, fn: Callable[..., Any]) -> Any:
        on_loop = self.env_cls.sync_code_on_loop
        self._in_thread = runs_in_thread(fn, on_loop)
        try:
            return await run_user_code(fn, sync_lock=self.sync_lock, on_loop=on_loop)
        finally:
            self._in_thread = False

    async def construct(self, task_spec: JSONObject, secrets: dict[str, str]) -> None:
        env = await self._lifecycle_step(functools.partial(self.env_cls, task_spec=task_spec, secrets=secrets))
        if self.state is EpisodeState.CONSTRUCTING:
            self.env = env  # else ended meanwhile: a constructed environment is not torn down

    async def attach_toolset(self, toolset_cls: type) -> None:
        self.toolset = await self._lifecycle_step(functools.partial(toolset_cls, self.env))

    async def setup(self) -> None:
        self.state = EpisodeState.SETTING_UP if self.state is EpisodeState.CONSTRUCTING else self.state
        assert self.env is not None
        if overrides(self.env, "setup"):  # else no thread round trip for nothing
            await self._lifecycle_step(self.env.setup)
        self._setup_progress = _SET_UP
        if self.state is EpisodeState.SETTING_UP:
            self.state = EpisodeState.READY

    async def teardown(self) -> None:
        if self._setup_progress != _SET_UP:
            return
        self._setup_progress = _TORN_DOWN
        assert self.env is not None
        if overrides(self.env, "teardown"):
            await run_user_code(self.env.teardown, sync_lock=self.sync_lock, on_loop=self.env_cls.sync_code_on_loop)

    def kill(self) -> None:
        # A thread cannot be stopped: code running in one runs to its end.
        self.end()

    def implements(self, hook: str) -> bool:
        return overrides(self.env, hook)

    # The calls below return `run_user_code`'s coroutine rather than await
    # it: one coroutine less per call on the hot path.

    def _call(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        return run_user_code(fn, *args, sync_lock=self.sync_lock, on_loop=self.env_cls.sync_code_on_loop)

    def prompt(self) -> Awaitable[Any]:
        return self._call(self.env.get_prompt)

    def messages(self) -> Awaitable[Any]:
        return self._call(self.env.get_messages)

    async def task_tools(self) -> ListToolsOutput:
        return _session_tools(self.env, await self._call(self.env.list_task_tools), self.toolset)

    def tool_marks(self, name: str) -> Union[ToolMarks, RunToolOutput]:
        tool = resolve_tool(self.env, name, self.toolset)
        if isinstance(tool, RunToolOutput):
            return tool
        self._resolved = (name, tool)  # the call that asked runs it next: no second lookup
        return marks_of(tool)

    async def run_tool(self, name: str, tool_input: JSONObject) -> RunToolOutput:
        resolved = self._resolved
        if resolved is not None and resolved[0] == name:
            self._resolved = None
            tool = resolved[1]
        else:
            tool = resolve_tool(self.env, name, self.toolset)
            if isinstance(tool, RunToolOutput):
                return tool
        args = tool_argument(tool, tool_input)
        if isinstance(args, RunToolOutput):
            return args
        return tool_result(name, await run_user_code(
            tool, *args, sync_lock=self.sync_lock, on_loop=self.env_cls.sync_code_on_loop))

    def score_group(self, candidates: Sequence[GroupCandidate]) -> Awaitable[Any]:
        return self._call(self.env.score_group, list(candidates))


def _session_tools(env: Environment, task_tools: ListToolsOutput, toolset: Any) -> ListToolsOutput:
    """An episode's tools: shared, then task-specific, then its session
    toolset's (which replace same-named ones); the terminal tool (the
    toolset's, else the environment's) apart."""
    listed = env.list_tools()
    terminal = listed.terminal_tool
    tools = listed.tools + task_tools.tools
    if toolset is not None:
        terminal = find_terminal_tool(toolset) or terminal
        toolset_tools = tool_specs_of(toolset)
        replaced = {spec.name for spec in toolset_tools}
        tools = [spec for spec in tools if spec.name not in replaced] + toolset_tools
    if terminal is not None:
        tools = [spec for spec in tools if spec.name != terminal.name]
    return ListToolsOutput(
        tools=tools, terminal_tool=terminal,
        supports_score_group=listed.supports_score_group, message_block_types=listed.message_block_types,
    )


class LocalCatalogHost(CatalogHost):
    """An environment class's own calls, in this process."""

    __slots__ = ()

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await run_user_code(fn, *args, on_loop=self.env_cls.sync_code_on_loop)

    async def list_splits(self) -> list[Any]:
        return list(await self._call(self.env_cls.list_splits))

    async def list_tools(self) -> ListToolsOutput:
        return self.env_cls.list_tools()

    async def list_tasks(self, split: str) -> Any:
        return await self._call(self.env_cls.list_tasks, split)

    async def num_tasks(self, split: str) -> int:
        """The number of tasks of a split (the default's: cached per class and split)."""
        if overrides(self.env_cls, "num_tasks"):
            return await self._call(self.env_cls.num_tasks, split)
        key = (self.env_cls, split)
        if key not in _NUM_TASKS:
            _NUM_TASKS[key] = len(await self.list_tasks(split))
        return _NUM_TASKS[key]

    async def get_task(self, split: str, index: int) -> JSONObject:
        if overrides(self.env_cls, "get_task"):
            return await self._call(self.env_cls.get_task, split, index)
        return (await self.list_tasks(split))[index]

    async def get_task_range(self, split: str, start: Optional[int], stop: Optional[int]) -> list[JSONObject]:
        if overrides(self.env_cls, "get_task_range"):
            return await self._call(self.env_cls.get_task_range, split, start, stop)
        return [await self.get_task(split, i) for i in task_slice(await self.num_tasks(split), start, stop)]


class LocalHosts(HostFactory):
    """Hosts in this process (the default)."""

    def __init__(self) -> None:
        self._catalogs: dict[type[Environment], LocalCatalogHost] = {}

    def episode(self, env_cls: type[Environment]) -> LocalEpisodeHost:
        return LocalEpisodeHost(env_cls)

    def catalog(self, env_cls: type[Environment]) -> LocalCatalogHost:
        host = self._catalogs.get(env_cls)
        if host is None:
            host = self._catalogs[env_cls] = LocalCatalogHost(env_cls)
        return host
