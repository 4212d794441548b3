"""What the package ships and what git tracks: the typing markers and the
reflection descriptors are in the wheel, and the committed generated code is
never ignored; what installs with what: the MCP SDK only in the `mcp` extra,
kept apart from openreward (pyproject.toml says why), and the README's test
command one install, the one CI runs."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.support.servers import ROOT
from tests.support.wheel import WHEEL_BUILD_TIMEOUT_S, wheel_file_names


@pytest.mark.timeout(WHEEL_BUILD_TIMEOUT_S)
def test_the_wheel_ships_the_typing_markers_and_the_documented_descriptors(tmp_path: Path) -> None:
    names = wheel_file_names(tmp_path)
    assert {"ors_grpc/py.typed", "http_bridge/py.typed", "ors_grpc/_generated/documented_descriptors.binpb"} <= names


def test_a_new_file_in_the_committed_generated_code_is_not_ignored() -> None:
    new_file = "clients/typescript/src/gen/ors/v1/new_pb.ts"
    ignored = subprocess.run(["git", "check-ignore", "-q", new_file], cwd=ROOT)
    assert ignored.returncode == 1, f"{new_file} would be ignored by .gitignore"
    # The buf templates' output at the repository root stays ignored.
    assert subprocess.run(["git", "check-ignore", "-q", "gen/ruby/ors/v1/x.rb"], cwd=ROOT).returncode == 0


def _requirement_names(extra: str | None) -> set[str]:
    """The names of what `ors-grpc` (with `extra`) requires, through the extras it names of itself."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    names: set[str] = set()
    for requirement in requirements:
        name, extras = re.match(r"^([A-Za-z0-9_.-]+)(?:\[([^]]+)\])?", requirement).groups()
        if name == "ors-grpc":
            for own in (extras or "").split(","):
                names |= _requirement_names(own.strip())
        else:
            names.add(name.lower())
    return names


def test_the_mcp_sdk_is_an_extra_kept_apart_from_openreward() -> None:
    assert "mcp" not in _requirement_names(None)
    assert "mcp" in _requirement_names("mcp")
    assert "openreward" in _requirement_names("test") and "mcp" not in _requirement_names("test")
    assert "mcp" in _requirement_names("test-mcp") and "openreward" not in _requirement_names("test-mcp")


def test_the_readme_test_command_is_one_install_and_ci_runs_it() -> None:
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"Run the tests .*?```bash\n(.*?)\n```", readme, re.DOTALL).group(1)
    assert command.count("pip install") == 1 and command.endswith("&& pytest"), command
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()
