"""Fresh virtualenvs, for what the README's test environment cannot hold or
cannot show: the MCP door's tests (the `mcp` extra cannot share an
environment with openreward, see pyproject.toml), and a user's one
`pip install` of the project beside openreward.

Each is made by the standard `venv` module with its own pip and installs
through pip's cache (nothing is downloaded twice); a failed install or a
`pip check` that is not clean fails the test with pip's own words."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping

import pytest

from tests.support.servers import ROOT

PIP_INSTALL_TIMEOUT_S = 900
#: Where the MCP door's test environment is kept between runs (git ignores it).
MCP_TEST_VENV = ROOT / ".venv-mcp"
#: What an MCP door test environment was built from: a different one is rebuilt.
_BUILT_FROM = "ors-grpc-built-from"


class Virtualenv:
    def __init__(self, path: Path) -> None:
        self.path = path

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    @property
    def environ(self) -> dict[str, str]:
        """This process's environment with this virtualenv activated (its scripts first on PATH)."""
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
        return {**env, "VIRTUAL_ENV": str(self.path), "PATH": f"{self.path / 'bin'}{os.pathsep}{env.get('PATH', '')}"}

    def run(self, program: str, *args: str, cwd: Path = ROOT, timeout: float = 600,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run one of this virtualenv's programs (`python`, `pip`, `ors-grpc` ...) with it activated."""
        return subprocess.run([self.bin(program), *args], cwd=cwd, env={**self.environ, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)

    def pip_install(self, *requirements: str) -> None:
        """One `pip install` of `requirements`, resolved together by pip, then a clean `pip check`."""
        done = self.run("python", "-m", "pip", "install", "--quiet", *requirements, timeout=PIP_INSTALL_TIMEOUT_S)
        if done.returncode != 0:
            pytest.fail(f"pip install {' '.join(requirements)} failed:\n{done.stdout}{done.stderr}")
        self.pip_check()

    def pip_check(self) -> str:
        done = self.run("python", "-m", "pip", "check")
        assert done.returncode == 0, f"pip check:\n{done.stdout}{done.stderr}"
        return done.stdout


def create(path: Path) -> Virtualenv:
    """A new, empty virtualenv at `path`, with this interpreter's Python."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True, timeout=300)
    return Virtualenv(path)


def mcp_test_environment() -> Virtualenv:
    """The MCP door's test environment: a virtualenv with this checkout installed
    (editable) with the `test-mcp` extra, kept in MCP_TEST_VENV and rebuilt when
    pyproject.toml or the Python version changes."""
    built_from = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + sys.version.encode()).hexdigest()
    stamp = MCP_TEST_VENV / _BUILT_FROM
    if stamp.is_file() and stamp.read_text() == built_from:
        return Virtualenv(MCP_TEST_VENV)
    shutil.rmtree(MCP_TEST_VENV, ignore_errors=True)
    venv = create(MCP_TEST_VENV)
    venv.pip_install("--editable", f"{ROOT}[test-mcp]")
    stamp.write_text(built_from)
    return venv
