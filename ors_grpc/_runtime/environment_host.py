"""The one seam between the runtime and environments' code: hosts.

Everything the server asks of an environment's code goes through a host:

- an `EpisodeHost` holds one episode's environment for its whole life
  (construct, attach its session toolset, set up, prompt, messages, task
  tools, a tool's marks, call a tool, score a group, tear down, kill) and
  knows where that life stands (`EpisodeState`);
- a `CatalogHost` answers an environment class's own calls (splits, tasks,
  its tool listing), which need no episode.

The session table gets both from a `HostFactory`, and owns everything else
(waiting, timeouts, errors as clients see them, records, metrics). The
first implementation, `local_hosts`, runs the code in the server's own
process, on its loop or in a user-code thread (`user_code`); hosts in worker
processes can take its place without the rest of the runtime changing.
"""

from __future__ import annotations

import abc
import enum
from typing import Any, Callable, Optional, Sequence, Union

from ors_grpc.authoring.environment import Environment, ToolMarks
from ors_grpc.authoring.types import GroupCandidate, JSONObject, ListToolsOutput, RunToolOutput
from ors_grpc.protocol.errors import ORSError

__all__ = ["CatalogHost", "EpisodeHost", "EpisodeState", "HostFactory"]


class EpisodeState(enum.Enum):
    """Where an episode's life stands. It moves forward only:
    CONSTRUCTING -> SETTING_UP -> READY, or to one of the two failures, or
    to CRASHED from any of them; ENDED (deleted, reaped, server stopped) can
    follow any state and is final."""

    #: The constructors (the environment's, its session toolset's) run.
    CONSTRUCTING = "constructing"
    #: Constructed (the creation has answered); `setup()` runs.
    SETTING_UP = "setting_up"
    #: Set up: its calls are served.
    READY = "ready"
    #: A constructor raised: the creation fails with the host's `failure`.
    CONSTRUCTION_FAILED = "construction_failed"
    #: `setup()` raised: every call of the episode answers the host's `failure`.
    SETUP_FAILED = "setup_failed"
    #: The process holding the environment ended (a worker): every call
    #: answers the host's `failure`. Final but for ENDED.
    CRASHED = "crashed"
    #: Ended: calls answer SESSION_DELETED, the environment is (being) torn down.
    ENDED = "ended"


class EpisodeHost(abc.ABC):
    """One episode's environment, wherever its code runs."""

    # Weakly referenced by tracing (the session of a host's tool calls).
    __slots__ = ("env_cls", "state", "failure", "__weakref__")

    def __init__(self, env_cls: type[Environment]) -> None:
        self.env_cls = env_cls
        self.state = EpisodeState.CONSTRUCTING
        #: Why a constructor or setup failed, as clients are answered (set with `fail`).
        self.failure: ORSError | None = None

    # The lifecycle -----------------------------------------------------------

    def fail(self, error: ORSError) -> None:
        """A constructor or `setup()` failed with `error` (what clients are answered)."""
        self.failure = error
        if self.state is EpisodeState.CONSTRUCTING:
            self.state = EpisodeState.CONSTRUCTION_FAILED
        elif self.state is EpisodeState.SETTING_UP:
            self.state = EpisodeState.SETUP_FAILED

    def crash(self, error: ORSError) -> None:
        """The process holding the environment ended: every call answers `error` from now on."""
        if self.state is not EpisodeState.ENDED:
            self.failure = error
            self.state = EpisodeState.CRASHED

    def end(self) -> None:
        """The episode is over (its calls answer SESSION_DELETED from now on)."""
        self.state = EpisodeState.ENDED

    @property
    @abc.abstractmethod
    def uninterruptible(self) -> bool:
        """Whether the lifecycle step running now (a constructor, `setup()`)
        cannot be cancelled, only waited for (sync code in a thread)."""

    @property
    @abc.abstractmethod
    def set_up(self) -> bool:
        """Whether `setup()` completed (so the environment needs its `teardown()`)."""

    @abc.abstractmethod
    async def construct(self, task_spec: JSONObject, secrets: dict[str, str]) -> None:
        """Construct the environment (raises what its constructor raises)."""

    @abc.abstractmethod
    async def attach_toolset(self, toolset_cls: type) -> None:
        """Construct the episode's session toolset on its environment."""

    @abc.abstractmethod
    async def setup(self) -> None:
        """Run the environment's `setup()` (raises what it raises); READY
        after, unless the episode ended meanwhile."""

    @abc.abstractmethod
    async def teardown(self) -> None:
        """Run the environment's `teardown()` once, if it was set up (raises what it raises)."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Stop the episode's code by force, where the host can; it is ENDED."""

    # The episode's calls (READY) ----------------------------------------------

    @abc.abstractmethod
    def implements(self, hook: str) -> bool:
        """Whether the environment overrides `hook` (`get_prompt`, `score_group`...)."""

    @abc.abstractmethod
    async def prompt(self) -> Any:
        """What `get_prompt()` returns."""

    @abc.abstractmethod
    async def messages(self) -> Any:
        """What `get_messages()` returns."""

    @abc.abstractmethod
    async def task_tools(self) -> ListToolsOutput:
        """The episode's tools: shared, task-specific, its session toolset's."""

    @abc.abstractmethod
    def tool_marks(self, name: str) -> Union[ToolMarks, RunToolOutput]:
        """How calls to tool `name` take turns (`authoring.ToolMarks`), or the
        refusal (not_found, name_collision) where the host can tell at once;
        raises when a declared toolset's constructor does."""

    @abc.abstractmethod
    async def run_tool(self, name: str, tool_input: JSONObject) -> RunToolOutput:
        """Run tool `name` on `tool_input`: an unknown name or invalid input
        is a refusal; what the tool raises propagates."""

    @abc.abstractmethod
    async def score_group(self, candidates: Sequence[GroupCandidate]) -> Any:
        """What `score_group(candidates)` returns."""


class CatalogHost(abc.ABC):
    """An environment class's own calls: they need no episode."""

    __slots__ = ("env_cls",)

    def __init__(self, env_cls: type[Environment]) -> None:
        self.env_cls = env_cls

    @abc.abstractmethod
    async def list_splits(self) -> list[Any]:
        """What `list_splits()` returns."""

    @abc.abstractmethod
    async def list_tools(self) -> ListToolsOutput:
        """The class's tool listing."""

    @abc.abstractmethod
    async def list_tasks(self, split: str) -> Any:
        """What `list_tasks(split)` returns (NotImplementedError when it cannot list)."""

    @abc.abstractmethod
    async def num_tasks(self, split: str) -> int:
        """The number of tasks of a split."""

    @abc.abstractmethod
    async def get_task(self, split: str, index: int) -> JSONObject:
        """Task `index` of a split (IndexError when out of range)."""

    @abc.abstractmethod
    async def get_task_range(self, split: str, start: Optional[int], stop: Optional[int]) -> list[JSONObject]:
        """Tasks in [start, stop) of a split, with Python slice conventions."""


class HostFactory(abc.ABC):
    """Where the session table gets its hosts."""

    async def start(self) -> None:
        """Make ready to host (start processes, ...), before the server serves."""

    async def close(self) -> None:
        """Release what `start` took, after the session table ended every episode."""

    def watch_availability(self, on_change: Callable[[bool], None]) -> None:
        """Be told when the hosts stop (False) or start again (True) being able
        to take new episodes (worker processes all down and coming back).
        In-process hosts always can: they never call it."""

    @abc.abstractmethod
    def episode(self, env_cls: type[Environment]) -> EpisodeHost:
        """A host for a new episode of `env_cls` (CONSTRUCTING, nothing run yet)."""

    @abc.abstractmethod
    def catalog(self, env_cls: type[Environment]) -> CatalogHost:
        """The host of `env_cls`'s class-level calls."""
