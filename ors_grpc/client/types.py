"""The client's own result types (the ORS data types come from `ors_grpc.authoring.types`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["EpisodeRecord", "EpisodeTotals", "Health", "Task", "ToolCallRecord"]


@dataclass(frozen=True)
class Task:
    """A task of an environment, as `ors.client.Task`: pass it to `env.session(task)`."""

    environment_name: str
    task_spec: Any


@dataclass(frozen=True)
class Health:
    """The server's Health answer: `status` is always `ok`."""

    status: str
    open_sessions: int


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call of an episode, as its record keeps it (never its output)."""

    tool_name: str
    #: The input; None when it was over 8 KiB of JSON (`input_omitted`).
    input: Optional[dict[str, Any]]
    input_omitted: bool
    input_bytes: int
    reward: Optional[float]
    finished: bool
    #: Why the call was refused without running (`not_found`, `name_collision`,
    #: `input_validation`, `episode_finished`); None when it ran.
    refusal_reason: Optional[str]
    #: The refusal's text or what the tool raised; None when the tool returned.
    error: Optional[str]
    started_at_unix_s: float
    #: None while the call runs.
    ended_at_unix_s: Optional[float]
    output_bytes: int


@dataclass(frozen=True)
class EpisodeTotals:
    """Totals over every tool call of an episode (also those past the record's cap)."""

    calls: int
    reward_sum: float
    last_reward: Optional[float]
    finished: bool


@dataclass(frozen=True)
class EpisodeRecord:
    """What happened in an episode (GetEpisodeRecord): see its proto comments."""

    session_id: str
    env_name: str
    task: Any
    toolset_name: Optional[str]
    created_at_unix_s: float
    calls: list[ToolCallRecord]
    #: Calls left out by the cap of 1,000 (the first are kept).
    calls_dropped: int
    totals: EpisodeTotals
    #: None while the episode is live, else `deleted`, `reaped` or `server_stopped`.
    ended: Optional[str]
    ended_at_unix_s: Optional[float]
    #: Why the setup failed (secrets masked); None when it did not.
    setup_error: Optional[str]
