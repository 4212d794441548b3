"""What starting a worker process takes: what it imports (`hop.Setup`),
the environment it runs in, how long it may take, and the error when it
cannot start. Workers import environments by `module:qualname`; a class
defined in the script the server runs as `__main__` they load from that
script's file, under another name (`MAIN_SCRIPT_MODULE`, as multiprocessing's
spawn does), so that its main block does not run again there. A class with no
file to load it from (`python -c`, a REPL, a notebook) or made at run time
cannot be served by workers (`unimportable` says why)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import sys
from typing import Any, Iterable, Optional

from ors_grpc._runtime.workers.hop import Setup

__all__ = [
    "MAIN_SCRIPT_MODULE", "WORKER_START_TIMEOUT_S", "WorkerStartupError", "import_path", "load", "unimportable",
    "worker_environment", "worker_setup",
]

#: Seconds a worker (or the template) may take to start and import the environments.
WORKER_START_TIMEOUT_S = 60.0
#: The name a worker loads the server's main script under: not `__main__`, so its main block does not run.
MAIN_SCRIPT_MODULE = "__mp_main__"


class WorkerStartupError(Exception):
    """Workers cannot serve these environments (a class they cannot import, an import that fails in a worker)."""


def import_path(cls: type, what: str) -> str:
    """What a worker loads `cls` by: `module:qualname`, or `/path/of/the/script.py:qualname` for
    a class of the server's main script; WorkerStartupError when it cannot be loaded."""
    if "<locals>" in cls.__qualname__:
        raise _cannot_import(cls, what, "is defined in a function")
    if cls.__module__ == "__main__":
        script = _main_script(cls)
        if script is None:
            raise _cannot_import(cls, what, "is defined in __main__ with no script file to load it from "
                                            "(python -c, a REPL, a notebook)")
        # Values of its classes that a worker sends back name the module the worker knows it by.
        sys.modules.setdefault(MAIN_SCRIPT_MODULE, sys.modules["__main__"])
        return f"{script}:{cls.__qualname__}"
    module = sys.modules.get(cls.__module__)
    if module is None or _attribute(module, cls.__qualname__) is not cls:
        raise _cannot_import(cls, what, f"was made at run time (it is not {cls.__module__}.{cls.__qualname__})")
    return f"{cls.__module__}:{cls.__qualname__}"


def unimportable(environments: Iterable[type], toolsets: Iterable[type]) -> Optional[str]:
    """Why workers could not load one of the classes (see `import_path`), or None when they can load them all."""
    for what, classes in (("environment", environments), ("toolset", toolsets)):
        for cls in classes:
            try:
                import_path(cls, what)
            except WorkerStartupError as exc:
                return str(exc)
    return None


def _cannot_import(cls: type, what: str, why: str) -> WorkerStartupError:
    return WorkerStartupError(f"{what} {cls.__qualname__!r} {why}: worker processes cannot load it "
                              f"(define it in a module, served as MODULE:CLASS, or in a script)")


def _main_script(cls: type) -> Optional[str]:
    """The file of the server's main script, if `cls` was defined in it (not in a notebook's
    cells, whose `__main__` is the kernel's launcher)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path or not path.endswith(".py"):
        return None
    path = os.path.abspath(path)
    for member in vars(cls).values():
        code = getattr(inspect.unwrap(getattr(member, "__func__", member)), "__code__", None)
        if code is not None and os.path.abspath(code.co_filename) == path:
            return path
    return None


def _attribute(target: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        target = getattr(target, part, None)
    return target


def load(spec: str) -> Any:
    """In a worker: the class `import_path` named, its module imported (or the main script loaded)."""
    where, _, qualname = spec.rpartition(":")
    module = _load_main_script(where) if where.endswith(".py") else importlib.import_module(where)
    found = _attribute(module, qualname)
    if found is None:
        raise AttributeError(f"{where} has no attribute {qualname!r}")
    return found


class ScriptServes(BaseException):
    """Raised in a worker when the server's script, loaded there, would serve
    (`Server(...).run()` outside a main guard): the script stops there, its
    classes defined. A BaseException, so that the script's own `except
    Exception` does not swallow it."""


#: Whether this process is loading the server's main script (a worker).
_loading_main_script = False


def stop_a_script_serving_in_a_worker() -> None:
    """Called by `Server.run`: in a worker loading the server's script, end the script's run there."""
    if _loading_main_script:
        raise ScriptServes()


def _load_main_script(path: str) -> Any:
    """The server's main script, run once in this process as `MAIN_SCRIPT_MODULE` (also `__main__`,
    so that values the server sends of its classes find them), up to where it would serve."""
    global _loading_main_script
    module = sys.modules.get(MAIN_SCRIPT_MODULE)
    if module is not None and getattr(module, "__file__", None) == path:
        return module
    spec = importlib.util.spec_from_file_location(MAIN_SCRIPT_MODULE, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MAIN_SCRIPT_MODULE] = sys.modules["__main__"] = module
    _loading_main_script = True
    try:
        spec.loader.exec_module(module)
    except ScriptServes:
        pass  # a script without a main guard: what it defined before serving is all a worker needs
    finally:
        _loading_main_script = False
    return module


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
