"""Finding the classes `ors-grpc serve` is told to serve: `MODULE:CLASS`, `PATH.py:CLASS`, or
`SOURCE:SPEC` of an installed environment source (another ecosystem's environments, ors_grpc/adapters).

A path (`./guessgame.py:GuessGame`, `envs/guessgame.py:GuessGame`) is imported
as `python envs/guessgame.py` would run it: its folder first on `sys.path`,
the module named after the file (`guessgame`). So the class's
`module:qualname` names it again for worker processes, which import
environments by that name with the server's `sys.path`.
A mistake in the spec is a `StartupError` (one line, exit status 2); an
exception raised while the user's module runs propagates with its traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from ors_grpc.authoring.environment import Environment
from ors_grpc.extras import extra_install_command
from ors_grpc.serving import StartupError

__all__ = ["ENVIRONMENT_SOURCES_GROUP", "environment_sources", "load_class", "load_environment", "load_environments",
           "load_toolset"]

#: Entry points that serve another ecosystem's environments: `ors-grpc serve NAME:TEXT` calls
#: the one named NAME with TEXT and serves the Environment classes it returns (ors_grpc/adapters).
ENVIRONMENT_SOURCES_GROUP = "ors_grpc.environment_sources"


def environment_sources() -> dict[str, EntryPoint]:
    """The installed environment sources (`reasoning-gym`, `openenv`, ...) by name."""
    return {entry.name: entry for entry in entry_points(group=ENVIRONMENT_SOURCES_GROUP)}


def load_environments(spec: str) -> list[type[Environment]]:
    """The Environment classes `spec` names: `SOURCE:TEXT` of an installed environment
    source (its extra installed), else one class (`load_environment`)."""
    source_name, sep, text = spec.partition(":")
    source = environment_sources().get(source_name) if sep else None
    if source is None:
        return [load_environment(spec)]
    try:
        make = source.load()
    except ImportError as exc:
        raise StartupError(f"{source_name}: {exc} (install the extra: {extra_install_command(source_name)})") from None
    try:
        found = list(make(text))
    except (ValueError, TypeError, LookupError, OSError, ImportError) as exc:
        raise StartupError(f"{spec}: {exc}") from None
    for cls in found:
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise StartupError(f"{spec}: the {source_name} source gave {cls!r}, not an ors_grpc.Environment")
    return found


def load_environment(spec: str) -> type[Environment]:
    """The Environment class `spec` names (see `load_class`)."""
    found = load_class(spec, "environment")
    if not issubclass(found, Environment):
        hint = ""
        if any(base.__module__.split(".")[0] == "ors" for base in found.__mro__):
            hint = " (it subclasses the reference SDK's: import Environment from ors_grpc instead of ors)"
        raise StartupError(f"{spec} is not a subclass of ors_grpc.Environment{hint}")
    return found


def load_toolset(spec: str) -> type:
    """The toolset class `spec` names (see `load_class`)."""
    return load_class(spec, "toolset")


def load_class(spec: str, what: str) -> type:
    """The class `MODULE:CLASS` or `PATH.py:CLASS` names, its module imported
    (the current directory is importable, as with `python -m`)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise StartupError(f"{what} must look like module.path:ClassName or path/to/file.py:ClassName, got {spec!r}")
    if _is_path(where):
        module_name = _importable_file(where)
    else:
        module_name = where
        if "" not in sys.path:
            sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise  # the user's module imports something missing: show where
        raise StartupError(f"cannot import {module_name!r}: {exc}") from None
    if _is_path(where):
        _check_same_file(module, where)
    try:
        found = getattr(module, name)
    except AttributeError:
        raise StartupError(f"{where} has no attribute {name!r}" if _is_path(where)
                           else f"module {module_name!r} has no attribute {name!r}") from None
    if not isinstance(found, type):
        raise StartupError(f"{what} {spec} is not a class")
    return found


def _is_path(where: str) -> bool:
    return where.endswith(".py") or os.sep in where or "/" in where


def _importable_file(path: str) -> str:
    """Put the folder of the Python file `path` first on `sys.path`; the module name it imports under."""
    file = Path(path)
    if file.suffix != ".py":
        raise StartupError(f"{path} is not a Python file (a path must end in .py; a module is module.path)")
    if not file.is_file():
        raise StartupError(f"no such file: {path}")
    folder = str(file.resolve().parent)
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    if not file.stem.isidentifier():
        raise StartupError(f"{path}: {file.stem!r} cannot be a module name: rename the file (letters, digits, _)")
    return file.stem


def _check_same_file(module: object, path: str) -> None:
    """The module imported under the file's name is that file, not another
    of the same name found first (a module of the standard library, or one already imported)."""
    loaded = getattr(module, "__file__", None)
    if loaded is None or Path(loaded).resolve() != Path(path).resolve():
        name = getattr(module, "__name__", "?")
        raise StartupError(f"{path}: the module name {name!r} is already taken by {loaded or 'a built-in module'}: "
                           f"rename the file")
