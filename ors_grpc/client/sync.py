"""The blocking client: `ORSClient(target)`, the same API as the async one without `await`.

    with ORSClient("127.0.0.1:50051") as client:
        env = client.environment("echoenv")
        with env.session(split="train", index=0) as session:
            output = session.call_tool("submit", {"answer": "4"})

It drives an `AsyncORSClient` on a private event loop in a daemon thread, so
the session's keepalive pings go on while the caller's thread is busy, and it
works from inside other event loops' threads too (e.g. Jupyter).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, Mapping, Optional, Sequence, TypeVar, Union

import grpc

from ors_grpc.authoring.types import GroupCandidate, GroupScore, Message, Split, TerminalToolSpec, ToolOutput, ToolSpec
from ors_grpc.client._connection import DEFAULT_MAX_MESSAGE_BYTES
from ors_grpc.client._convert import Block
from ors_grpc.client._tool_formats import Provider
from ors_grpc.client.aio import AsyncEnvironment, AsyncORSClient
from ors_grpc.client.session import DEFAULT_PING_INTERVAL_S, DEFAULT_REATTACH_ATTEMPTS, AsyncSession
from ors_grpc.client.types import EpisodeRecord, Health, Task

__all__ = ["Environment", "ORSClient", "Session"]

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread; `run` blocks on one coroutine."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ors-grpc-client", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt: stop the coroutine too
            raise

    @property
    def closed(self) -> bool:
        return self._loop.is_closed()

    def stop(self) -> None:
        if self.closed:
            return
        self.run(_cancel_other_tasks())  # e.g. the pinger of a session left open
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _cancel_other_tasks() -> None:
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class Session:
    """`with env.session(...) as session:` runs one episode; see AsyncSession."""

    def __init__(self, async_session: AsyncSession, loop: _LoopThread) -> None:
        self._async = async_session
        self._loop = loop

    @property
    def session_id(self) -> Optional[str]:
        return self._async.session_id

    def __enter__(self) -> "Session":
        self._loop.run(self._async.__aenter__())
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._loop.run(self._async.__aexit__(*exc_info))

    def close(self) -> None:
        self._loop.run(self._async.close())

    def get_prompt(self) -> list[Block]:
        return self._loop.run(self._async.get_prompt())

    def list_tools(self, format: Optional[Provider] = None) -> Union[list[ToolSpec], list[dict[str, Any]]]:
        return self._loop.run(self._async.list_tools(format))

    def call_tool(self, name: str, input: Optional[Mapping[str, Any]] = None) -> ToolOutput:
        return self._loop.run(self._async.call_tool(name, input))

    def get_messages(self, format: Optional[Provider] = None) -> Union[list[Message], list[dict[str, Any]], dict[str, Any]]:
        return self._loop.run(self._async.get_messages(format))

    def terminal_tool(self) -> Optional[TerminalToolSpec]:
        return self._loop.run(self._async.terminal_tool())

    def is_assistant_message_final(self) -> bool:
        return self._loop.run(self._async.is_assistant_message_final())

    def call_terminal_tool(self, message: str = "") -> ToolOutput:
        return self._loop.run(self._async.call_terminal_tool(message))

    def supports_score_group(self) -> bool:
        return self._loop.run(self._async.supports_score_group())

    def score_group(self, candidates: Sequence[Union[GroupCandidate, Sequence[Message]]]) -> list[GroupScore]:
        return self._loop.run(self._async.score_group(candidates))

    def ping(self) -> None:
        self._loop.run(self._async.ping())

    def episode_record(self) -> EpisodeRecord:
        return self._loop.run(self._async.episode_record())


class Environment:
    """One environment of the server; see AsyncEnvironment."""

    def __init__(self, async_env: AsyncEnvironment, loop: _LoopThread) -> None:
        self._async = async_env
        self._loop = loop

    @property
    def name(self) -> str:
        return self._async.name

    def list_splits(self) -> list[Split]:
        return self._loop.run(self._async.list_splits())

    def list_tasks(self, split: str) -> list[Task]:
        return self._loop.run(self._async.list_tasks(split))

    def num_tasks(self, split: str) -> int:
        return self._loop.run(self._async.num_tasks(split))

    def get_task(self, split: str, index: int) -> Task:
        return self._loop.run(self._async.get_task(split, index))

    def get_task_range(self, split: str, start: Optional[int] = None, stop: Optional[int] = None) -> list[Task]:
        return self._loop.run(self._async.get_task_range(split, start, stop))

    def list_tools(self, format: Optional[Provider] = None) -> Union[list[ToolSpec], list[dict[str, Any]]]:
        return self._loop.run(self._async.list_tools(format))

    def prepare(
        self,
        tasks: Optional[Sequence[Union[Task, Mapping[str, Any]]]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        *,
        split: Optional[str] = None,
        indices: Optional[Sequence[int]] = None,
        session_ids: Optional[Sequence[str]] = None,
    ) -> int:
        """Warm episodes: see AsyncEnvironment.prepare."""
        return self._loop.run(self._async.prepare(tasks, secrets, split=split, indices=indices,
                                                  session_ids=session_ids))

    def cancel_prepared(
        self,
        tasks: Optional[Sequence[Union[Task, Mapping[str, Any]]]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        *,
        split: Optional[str] = None,
        indices: Optional[Sequence[int]] = None,
    ) -> int:
        """Warm episodes: see AsyncEnvironment.cancel_prepared."""
        return self._loop.run(self._async.cancel_prepared(tasks, secrets, split=split, indices=indices))

    def terminal_tool(self) -> Optional[TerminalToolSpec]:
        return self._loop.run(self._async.terminal_tool())

    def supports_score_group(self) -> bool:
        return self._loop.run(self._async.supports_score_group())

    def session(
        self,
        task: Union[Task, Mapping[str, Any], None] = None,
        secrets: Optional[Mapping[str, str]] = None,
        *,
        split: Optional[str] = None,
        index: Optional[int] = None,
        toolset: Union[str, type, None] = None,
        session_id: Optional[str] = None,
    ) -> Session:
        """An episode; see AsyncEnvironment.session."""
        session = self._async.session(task, secrets, split=split, index=index, toolset=toolset, session_id=session_id)
        return Session(session, self._loop)


class ORSClient:
    """A blocking client of one ORS gRPC server; see AsyncORSClient for the arguments."""

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
        self._loop = _LoopThread()
        self._async = AsyncORSClient(
            target,
            api_key,
            credentials=credentials,
            max_message_bytes=max_message_bytes,
            ping_interval_s=ping_interval_s,
            reattach_attempts=reattach_attempts,
            stream_episodes=stream_episodes,
        )

    @property
    def target(self) -> str:
        return self._async.target

    def __enter__(self) -> "ORSClient":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channel and stops the client's thread. Idempotent."""
        if not self._loop.closed:
            self._loop.run(self._async.close())
        self._loop.stop()

    def health(self) -> Health:
        return self._loop.run(self._async.health())

    def version(self) -> str:
        return self._loop.run(self._async.version())

    def episode_record(self, session_id: str) -> EpisodeRecord:
        return self._loop.run(self._async.episode_record(session_id))

    def list_environments(self) -> list[str]:
        return self._loop.run(self._async.list_environments())

    def environment(self, name: str) -> Environment:
        return Environment(self._async.environment(name), self._loop)
