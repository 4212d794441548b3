"""A test skipped for a missing system tool says why, and under ORS_TESTS_NO_SKIP=1 (.ci/run) it fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.servers import ROOT
from tests.support.tooling import NO_SKIP_ENV

PROBE = '''
import pytest

@pytest.mark.skipif(True, reason="frobnicator is not installed")
def test_needs_a_missing_tool():
    pass
'''


def run_probe(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probe.py").write_text(PROBE)
    environ = {k: v for k, v in os.environ.items() if k != NO_SKIP_ENV}
    environ["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        # Our conftest (the hook) and pyproject's options (-rs), on a test outside tests/.
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(tmp_path / "test_probe.py")],
        cwd=ROOT, env={**environ, **env}, capture_output=True, text=True, timeout=120,
    )


def test_a_skip_shows_its_reason(tmp_path: Path) -> None:
    result = run_probe(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SKIPPED" in result.stdout and "frobnicator is not installed" in result.stdout


def test_a_skip_fails_in_ci(tmp_path: Path) -> None:
    result = run_probe(tmp_path, **{NO_SKIP_ENV: "1"})
    assert result.returncode == 1, result.stdout + result.stderr
    # A skip in setup (a skipif marker, a fixture) is reported as an error, in the call as a failure.
    assert re.search(r"\b1 (failed|error)\b", result.stdout), result.stdout
    assert "skipped" not in result.stdout.splitlines()[-1]
    assert f"{NO_SKIP_ENV}=1 makes every skip a failure: frobnicator is not installed" in result.stdout
