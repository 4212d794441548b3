"""The asyncio client: `AsyncORSClient(target)` and its environments.

    async with AsyncORSClient("127.0.0.1:50051") as client:
        env = client.environment("echoenv")
        async with env.session(split="train", index=0) as session:
            prompt = await session.get_prompt()
            output = await session.call_tool("submit", {"answer": "4"})
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Mapping, Optional, Sequence, Union

import grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc.authoring.types import Split, TerminalToolSpec, ToolSpec
from ors_grpc.client import _convert
from ors_grpc.client._connection import DEFAULT_MAX_MESSAGE_BYTES, Connection
from ors_grpc.client._tool_formats import Provider, format_tools
from ors_grpc.client.session import DEFAULT_PING_INTERVAL_S, DEFAULT_REATTACH_ATTEMPTS, AsyncSession
from ors_grpc.client.types import EpisodeRecord, Health, Task

__all__ = ["API_KEY_ENV_VAR", "AsyncEnvironment", "AsyncORSClient"]

#: Where the API key is read from when none is passed, as in ors-sdk's client.
API_KEY_ENV_VAR = "ORS_API_KEY"


class AsyncORSClient:
    """A client of one ORS gRPC server (`host:port`), over one HTTP/2 channel.

    `credentials` (e.g. `grpc.ssl_channel_credentials()`) selects TLS; the
    API key is sent as `x-api-key` metadata on every call. `stream_episodes`
    runs each session's steps over one RunEpisode stream (see AsyncSession);
    False makes one RPC per step.
    """

    def __init__(
        self,
        target: str,
        api_key: Optional[str] = None,
        *,
        credentials: Optional[grpc.ChannelCredentials] = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        ping_interval_s: float = DEFAULT_PING_INTERVAL_S,
        reattach_attempts: int = DEFAULT_REATTACH_ATTEMPTS,
        stream_episodes: bool = True,
    ) -> None:
        api_key = api_key or os.environ.get(API_KEY_ENV_VAR)
        self._connection = Connection(target, api_key, credentials, max_message_bytes)
        self._session_options = {
            "ping_interval_s": ping_interval_s,
            "reattach_attempts": reattach_attempts,
            "stream_episode": stream_episodes,
        }

    @property
    def target(self) -> str:
        return self._connection.target

    async def __aenter__(self) -> "AsyncORSClient":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def close(self) -> None:
        await self._connection.close()

    async def health(self) -> Health:
        response = await self._connection.unary("Health", pb.HealthRequest())
        return Health(status=response.status, open_sessions=response.open_sessions)

    async def version(self) -> str:
        return (await self._connection.unary("Version", pb.VersionRequest())).version

    async def episode_record(self, session_id: str) -> EpisodeRecord:
        """What happened in the episode of `session_id` (made by any client, on any door):
        live, or ended within the server's linger time."""
        response = await self._connection.unary("GetEpisodeRecord", pb.GetEpisodeRecordRequest(session_id=session_id),
                                                route_key=session_id)
        return _convert.episode_record(response.record)

    async def list_environments(self) -> list[str]:
        return list((await self._connection.unary("ListEnvironments", pb.ListEnvironmentsRequest())).names)

    def environment(self, name: str) -> "AsyncEnvironment":
        return AsyncEnvironment(name, self._connection, self._session_options)


def _name_tasks(
    request: Any, tasks: Optional[Sequence[Union[Task, Mapping[str, Any]]]],
    split: Optional[str], indices: Optional[Sequence[int]],
) -> None:
    """Fill a PrepareEpisodes or CancelPreparedEpisodes request's tasks: task specs, or split and indices."""
    if tasks is not None:
        specs = [task.task_spec if isinstance(task, Task) else task for task in tasks]
        request.task_specs.extend(_convert.json_value(spec) for spec in specs)
    elif split is not None:
        request.split, request.indices[:] = split, list(indices or ())


class AsyncEnvironment:
    """One environment of the server: discovery calls and `session(...)`."""

    def __init__(self, name: str, connection: Connection, session_options: Mapping[str, Any]) -> None:
        self.name = name
        self._connection = connection
        self._session_options = dict(session_options)

    async def list_splits(self) -> list[Split]:
        response = await self._connection.unary("ListSplits", pb.ListSplitsRequest(env_name=self.name))
        return [_convert.split(s) for s in response.splits]

    async def list_tasks(self, split: str) -> list[Task]:
        response = await self._connection.unary("ListTasks", pb.ListTasksRequest(env_name=self.name, split=split))
        return self._tasks(response.tasks)

    async def num_tasks(self, split: str) -> int:
        response = await self._connection.unary("NumTasks", pb.NumTasksRequest(env_name=self.name, split=split))
        return response.num_tasks

    async def get_task(self, split: str, index: int) -> Task:
        request = pb.GetTaskRequest(env_name=self.name, split=split, index=index)
        response = await self._connection.unary("GetTask", request)
        return Task(self.name, _convert.task_spec(response.task))

    async def get_task_range(self, split: str, start: Optional[int] = None, stop: Optional[int] = None) -> list[Task]:
        """Tasks [start, stop) with Python slice semantics (None = the ends, negatives from the end)."""
        request = pb.GetTaskRangeRequest(env_name=self.name, split=split, start=start, stop=stop)
        response = await self._connection.unary("GetTaskRange", request)
        return self._tasks(response.tasks)

    async def list_tools(self, format: Optional[Provider] = None) -> Union[list[ToolSpec], list[dict[str, Any]]]:
        """The environment's shared tools, optionally in a provider's shape ("openai", "anthropic", "google")."""
        response = await self._connection.unary("ListTools", pb.ListToolsRequest(env_name=self.name))
        return format_tools([_convert.tool_spec(t) for t in response.tools], format)

    async def terminal_tool(self) -> Optional[TerminalToolSpec]:
        """The environment's terminal tool (hidden from `list_tools`), or None."""
        response = await self._connection.unary("ListTools", pb.ListToolsRequest(env_name=self.name))
        return _convert.terminal_tool(response)

    async def supports_score_group(self) -> bool:
        """True when the environment implements group scoring."""
        response = await self._connection.unary("ListTools", pb.ListToolsRequest(env_name=self.name))
        return response.supports_score_group

    def session(
        self,
        task: Union[Task, Mapping[str, Any], None] = None,
        secrets: Optional[Mapping[str, str]] = None,
        *,
        split: Optional[str] = None,
        index: Optional[int] = None,
        toolset: Union[str, type, None] = None,
        session_id: Optional[str] = None,
    ) -> AsyncSession:
        """An episode on `task` (a Task or a task spec) or on task `index` of `split`.

        `toolset`: a toolset registered with the server, by name (or its
        class, named by `name()`), to attach to the episode. `session_id`:
        the id to create it under (by default a new one), such as one that
        `prepare(..., session_ids=...)` reserved: the creation then claims
        that prepared episode, on the backend the id routes to. Use it as
        `async with env.session(...) as session:`.
        """
        request = pb.CreateEpisodeRequest(env_name=self.name, secrets=dict(secrets or {}))
        if toolset is not None:
            request.toolset_name = toolset if isinstance(toolset, str) else _toolset_name(toolset)
        if (task is None) == (split is None or index is None) or (split is None) != (index is None):
            raise ValueError("pass either task, or both split and index")
        if task is not None:
            spec = task.task_spec if isinstance(task, Task) else task
            request.task_spec.CopyFrom(_convert.json_value(spec))
        else:
            request.task_index.CopyFrom(pb.TaskIndex(split=split, index=index))
        return AsyncSession(self._connection, self.name, request, session_id=session_id, **self._session_options)

    async def prepare(
        self,
        tasks: Optional[Sequence[Union[Task, Mapping[str, Any]]]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        *,
        split: Optional[str] = None,
        indices: Optional[Sequence[int]] = None,
        session_ids: Optional[Sequence[str]] = None,
    ) -> int:
        """Has the server set up episodes of `tasks` (Tasks or task specs), or
        of tasks `indices` of `split`, ahead: a later `session(...)` of the
        same task with the same secrets claims one and starts without waiting
        for its setup (warm episodes, an ORS extension; PrepareEpisodes).
        One episode per entry; returns how many are being prepared.

        With `session_ids` (one per entry, e.g. `str(uuid.uuid4())` each),
        each episode is reserved for `session(..., session_id=that id)`, and
        prepared by its own request routed by that id (`x-session-id`), so
        that behind a load balancer hashing it the prepare and the creation
        reach the same backend. The requests go concurrently; the first
        that fails raises (the others' episodes expire unclaimed)."""
        if (tasks is None) == (split is None or indices is None) or (split is None) != (indices is None):
            raise ValueError("pass either tasks, or both split and indices")
        request = pb.PrepareEpisodesRequest(env_name=self.name, secrets=dict(secrets or {}))
        _name_tasks(request, tasks, split, indices)
        if session_ids is None:
            return (await self._connection.unary("PrepareEpisodes", request)).preparing
        if len(session_ids) != len(request.task_specs) + len(request.indices):
            raise ValueError("pass one session id per task")
        answers = await asyncio.gather(*(
            self._connection.unary("PrepareEpisodes", _one_reserved(request, position, sid), route_key=sid)
            for position, sid in enumerate(session_ids)
        ))
        return sum(answer.preparing for answer in answers)

    async def cancel_prepared(
        self,
        tasks: Optional[Sequence[Union[Task, Mapping[str, Any]]]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        *,
        split: Optional[str] = None,
        indices: Optional[Sequence[int]] = None,
    ) -> int:
        """Cancels episodes `prepare` set up that are not claimed yet (their
        setup cancelled, `teardown()` run, their places in the server's
        session limit freed): one of each of `tasks` (or of tasks `indices`
        of `split`), or, with none given, every one of this environment
        prepared with the same secrets (CancelPreparedEpisodes). Returns how
        many were cancelled."""
        if tasks is not None and (split is not None or indices is not None) or (split is None) != (indices is None):
            raise ValueError("pass tasks, or both split and indices, or neither (all)")
        request = pb.CancelPreparedEpisodesRequest(env_name=self.name, secrets=dict(secrets or {}))
        _name_tasks(request, tasks, split, indices)
        return (await self._connection.unary("CancelPreparedEpisodes", request)).cancelled

    def _tasks(self, messages: Any) -> list[Task]:
        return [Task(self.name, _convert.task_spec(m)) for m in messages]


def _one_reserved(request: pb.PrepareEpisodesRequest, position: int, session_id: str) -> pb.PrepareEpisodesRequest:
    """The entry at `position` of a PrepareEpisodes request, alone, reserved for `session_id`."""
    one = pb.PrepareEpisodesRequest(env_name=request.env_name, secrets=request.secrets, session_ids=[session_id])
    if request.task_specs:
        one.task_specs.append(request.task_specs[position])
    else:
        one.split, one.indices[:] = request.split, [request.indices[position]]
    return one


def _toolset_name(toolset: Any) -> str:
    """The registered name of a toolset class or instance: its `name()`, else its class name."""
    toolset_cls = toolset if isinstance(toolset, type) else type(toolset)
    name = getattr(toolset_cls, "name", None)
    return name() if callable(name) else toolset_cls.__name__
