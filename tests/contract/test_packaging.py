"""What the package ships and what git tracks: the typing markers and the
reflection descriptors are in the wheel, and the committed generated code is
never ignored."""

from __future__ import annotations

import subprocess
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
