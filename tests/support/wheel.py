"""The project's wheel, built as pip builds it, for tests of what it ships."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.servers import ROOT

WHEEL_BUILD_TIMEOUT_S = 300


def build_wheel(out_dir: Path) -> Path:
    """Build the wheel into `out_dir`; its path."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out_dir), str(ROOT)],
                   check=True, timeout=WHEEL_BUILD_TIMEOUT_S, capture_output=True)
    (wheel,) = out_dir.glob("ors_grpc-*.whl")
    return wheel


def wheel_file_names(out_dir: Path) -> set[str]:
    """Build the wheel into `out_dir`; the names of the files in it."""
    return set(zipfile.ZipFile(build_wheel(out_dir)).namelist())
