"""The processes a server runs under it (workers, the template, episode
processes), as the worker tests inspect them from outside."""

from __future__ import annotations

import psutil


def children(pid: int) -> list[int]:
    """The processes `pid` started itself, sorted."""
    return sorted(child.pid for child in psutil.Process(pid).children())


def descendants(pid: int) -> list[int]:
    """Every live process under `pid` (an episode process is the server's grandchild)."""
    return [process.pid for process in psutil.Process(pid).children(recursive=True)]


def parent_of(pid: int) -> int:
    return psutil.Process(pid).ppid()


def process_gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie counts: ended, not yet reaped)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
