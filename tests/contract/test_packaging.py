"""What the package ships and what git tracks: the typing marker is in the
wheel, and the committed generated code is never ignored."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "ors_grpc", "http_bridge")


@pytest.mark.timeout(240)
def test_the_wheel_ships_the_typing_markers(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building in place would leave build/ in the work tree
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source),
         "-w", str(tmp_path / "dist")],
        check=True, capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("ors_grpc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"ors_grpc/py.typed", "http_bridge/py.typed"} <= names


def test_a_new_file_in_the_committed_generated_code_is_not_ignored() -> None:
    new_file = "clients/typescript/src/gen/ors/v1/new_pb.ts"
    ignored = subprocess.run(["git", "check-ignore", "-q", new_file], cwd=ROOT)
    assert ignored.returncode == 1, f"{new_file} would be ignored by .gitignore"
    # The buf templates' output at the repository root stays ignored.
    assert subprocess.run(["git", "check-ignore", "-q", "gen/ruby/ors/v1/x.rb"], cwd=ROOT).returncode == 0
