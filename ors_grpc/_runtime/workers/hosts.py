"""Hosts whose environments live in worker processes (the second
implementation of `environment_host`): `WorkerHosts`, the host factory over
a pool of processes, and the episode and catalog hosts, each a thin proxy
that sends its calls over a process's connection. The server keeps
everything else: doors, sessions, tool-call tasks, records, metrics."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable, Optional, Sequence, Union

from ors_grpc._runtime.environment_host import CatalogHost, EpisodeHost, EpisodeState, HostFactory
from ors_grpc._runtime.workers.connection import WorkerConnection
from ors_grpc._runtime.workers.placement import EpisodePlacement, SharedPlacement
from ors_grpc._runtime.workers.pool import WorkerPool
from ors_grpc._runtime.workers.spawner import FreshInterpreters, TemplateForks
from ors_grpc._runtime.workers.startup import import_path, worker_setup
from ors_grpc._runtime.workers.watchdog import DEFAULT_STALL_LIMIT_S, Watchdog, heartbeat_interval_s
from ors_grpc.authoring.environment import Environment, ToolMarks, not_a_tool, overrides, tool_marks
from ors_grpc.authoring.types import GroupCandidate, JSONObject, ListToolsOutput, RunToolOutput

__all__ = ["WorkerCatalogHost", "WorkerEpisodeHost", "WorkerHosts"]

class WorkerEpisodeHost(EpisodeHost):
    """One episode whose environment lives in a worker process."""

    __slots__ = ("_connection", "_eid", "_toolset_cls", "_set_up", "_env_name", "_defines_setup", "_defines_teardown")

    def __init__(self, env_cls: type[Environment], env_name: str, connection: WorkerConnection, eid: int) -> None:
        super().__init__(env_cls)
        self._connection = connection
        self._eid = eid
        self._env_name = env_name
        self._toolset_cls: Optional[type] = None
        self._set_up = False
        #: Whether the environment (the instance the worker constructed) defines `setup()`, `teardown()`:
        #: a step it does not define crosses no hop, as in-process it runs no code.
        self._defines_setup = self._defines_teardown = True
        connection.hosts[eid] = self

    @property
    def uninterruptible(self) -> bool:
        return False  # the server stops waiting; the worker tears the episode down once its step ends

    @property
    def set_up(self) -> bool:
        return self._set_up

    async def construct(self, task_spec: JSONObject, secrets: dict[str, str]) -> None:
        self._defines_setup, self._defines_teardown = await self._connection.call(
            "construct", self._eid, self._env_name, task_spec, secrets)

    async def attach_toolset(self, toolset_cls: type) -> None:
        self._toolset_cls = toolset_cls
        await self._connection.call("attach_toolset", self._eid, import_path(toolset_cls, "toolset"))

    async def setup(self) -> None:
        if self.state is EpisodeState.CONSTRUCTING:
            self.state = EpisodeState.SETTING_UP
        if self._defines_setup:
            await self._connection.call("setup", self._eid)
        self._set_up = True
        if self.state is EpisodeState.SETTING_UP:
            self.state = EpisodeState.READY

    async def teardown(self) -> None:
        if not self._connection.alive:  # the environment went with its process
            return
        if self._defines_teardown:  # (with whether it was set up here, its setup() being none)
            await self._connection.call("teardown", self._eid, self._set_up and not self._defines_setup)
        elif self._set_up:  # nothing to run: the worker forgets the episode (`end` told it so if not set up)
            self._connection.tell("end", self._eid)

    def end(self) -> None:
        if self.state is not EpisodeState.ENDED:
            self._connection.hosts.pop(self._eid, None)
            if not self._set_up:  # else its teardown, which the session table always runs next, ends it there
                self._connection.tell("end", self._eid)
        super().end()

    def kill(self) -> None:
        self.end()

    def implements(self, hook: str) -> bool:
        return overrides(self.env_cls, hook)

    def prompt(self) -> Any:
        return self._connection.call("prompt", self._eid)

    def messages(self) -> Any:
        return self._connection.call("messages", self._eid)

    def task_tools(self) -> Any:
        return self._connection.call("task_tools", self._eid)

    def tool_marks(self, name: str) -> Union[ToolMarks, RunToolOutput]:
        # Read off the classes here (the worker resolves the tool itself); a name none of them
        # declares is refused here, before the episode's state is read, as in-process.
        marks = tool_marks(self.env_cls, name, self._toolset_cls)
        return not_a_tool(name) if marks is None else marks

    def run_tool(self, name: str, tool_input: JSONObject) -> Any:
        return self._connection.call("run_tool", self._eid, name, tool_input)

    def score_group(self, candidates: Sequence[GroupCandidate]) -> Any:
        return self._connection.call("score_group", self._eid, list(candidates))


class WorkerCatalogHost(CatalogHost):
    """An environment class's own calls, answered by the process the placement picks."""

    __slots__ = ("_pool", "_env_name")

    def __init__(self, env_cls: type[Environment], env_name: str, pool: WorkerPool) -> None:
        super().__init__(env_cls)
        self._pool = pool
        self._env_name = env_name

    async def _call(self, method: str, *args: Any) -> Any:
        connection = await self._pool.for_catalog()
        return await connection.call("catalog", self._env_name, method, args)

    def list_splits(self) -> Any:
        return self._call("list_splits")

    async def list_tools(self) -> ListToolsOutput:
        return self.env_cls.list_tools()  # the class's own declaration: no environment code runs

    def list_tasks(self, split: str) -> Any:
        return self._call("list_tasks", split)

    def num_tasks(self, split: str) -> Any:
        return self._call("num_tasks", split)

    def get_task(self, split: str, index: int) -> Any:
        return self._call("get_task", split, index)

    def get_task_range(self, split: str, start: Optional[int], stop: Optional[int]) -> Any:
        return self._call("get_task_range", split, start, stop)


class WorkerHosts(HostFactory):
    """Hosts in `size` supervised worker processes for `environments` (and
    `toolsets`): each shared by many episodes, or, with `per_episode`, a
    process per episode forked from a template (`size` kept started ahead)."""

    def __init__(
        self, size: int, environments: dict[str, type[Environment]], toolsets: dict[str, type], *,
        per_episode: bool = False, memory_limit_mib: Optional[float] = None,
        stall_limit_s: float = DEFAULT_STALL_LIMIT_S, clock: Optional[Callable[[], float]] = None,
    ) -> None:
        self._names = {env_cls: name for name, env_cls in environments.items()}
        self._setup = worker_setup(environments, toolsets, heartbeat_interval_s=heartbeat_interval_s(stall_limit_s),
                                   exit_after_episode=per_episode)
        self._size = size
        self._per_episode = per_episode
        self._watchdog = Watchdog(stall_limit_s=stall_limit_s,
                                  memory_limit_bytes=memory_limit_mib * 1024 * 1024 if memory_limit_mib else None)
        self._clock = clock
        self._pool: Optional[WorkerPool] = None
        self._catalogs: dict[type[Environment], WorkerCatalogHost] = {}
        self._episode_ids = itertools.count(1)
        self._on_availability: Callable[[bool], None] = lambda available: None

    async def start(self) -> None:
        clock = self._clock or asyncio.get_running_loop().time
        placement = EpisodePlacement(self._size) if self._per_episode else SharedPlacement(self._size)
        spawner = TemplateForks(clock) if self._per_episode else FreshInterpreters()
        self._pool = WorkerPool(self._setup, placement, spawner, self._watchdog, clock=clock)
        self._pool.watch_availability(self._on_availability)
        await self._pool.start()

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    def watch_availability(self, on_change: Callable[[bool], None]) -> None:
        self._on_availability = on_change
        if self._pool is not None:
            self._pool.watch_availability(on_change)

    def episode(self, env_cls: type[Environment]) -> WorkerEpisodeHost:
        assert self._pool is not None
        return WorkerEpisodeHost(env_cls, self._names[env_cls], self._pool.for_episode(), next(self._episode_ids))

    def catalog(self, env_cls: type[Environment]) -> WorkerCatalogHost:
        assert self._pool is not None
        host = self._catalogs.get(env_cls)
        if host is None:
            host = self._catalogs[env_cls] = WorkerCatalogHost(env_cls, self._names[env_cls], self._pool)
        return host
