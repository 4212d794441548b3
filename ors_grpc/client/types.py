"""The client's own result types (the ORS data types come from `ors_grpc.authoring.types`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Health", "Task"]


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
