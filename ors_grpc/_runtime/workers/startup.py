"""What starting a worker process takes: what it imports (`hop.Setup`),
the environment it runs in, how long it may take, and the error when it
cannot start. Environments are imported in workers by `module:qualname`, so
a class defined in a script's `__main__` cannot be served by them."""

from __future__ import annotations

import logging
import os
import sys

from ors_grpc._runtime.workers.hop import Setup

__all__ = ["WORKER_START_TIMEOUT_S", "WorkerStartupError", "import_path", "worker_environment", "worker_setup"]

#: Seconds a worker (or the template) may take to start and import the environments.
WORKER_START_TIMEOUT_S = 60.0


class WorkerStartupError(Exception):
    """Workers cannot serve these environments (a class in `__main__`, an import that fails in a worker)."""


def import_path(cls: type, what: str) -> str:
    """`module:qualname` of a class a worker must import; WorkerStartupError when it cannot."""
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        raise WorkerStartupError(
            f"{what} {cls.__qualname__!r} is defined in {'a function' if '<locals>' in cls.__qualname__ else '__main__'}: "
            f"worker processes import environments by module. Move it to a module and serve MODULE:CLASS "
            f"(or serve without --workers)")
    return f"{cls.__module__}:{cls.__qualname__}"


def worker_setup(
    environments: dict[str, type], toolsets: dict[str, type], *, heartbeat_interval_s: float,
    exit_after_episode: bool,
) -> Setup:
    """What every worker imports (environments by served name, toolsets), and how it runs."""
    return Setup(
        sys_path=list(sys.path),
        environments={name: import_path(cls, "environment") for name, cls in environments.items()},
        toolsets=[import_path(cls, "toolset") for cls in toolsets.values()],
        log_level=logging.getLogger().getEffectiveLevel(),
        exit_after_episode=exit_after_episode,
        heartbeat_interval_s=heartbeat_interval_s,
    )


def worker_environment() -> dict[str, str]:
    """The server's environment for a worker, unbuffered (its log lines arrive whole)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}
