"""Test helper: the TypeScript client (clients/typescript) compiled, and its node:test suites run.

    compile_client()                                   # npm ci when needed, then tsc
    run_suites("127.0.0.1:50051", suites("echoenv"))   # node --test, TAP on stdout

A suite folder under clients/typescript/test/ is named after the environment
its server must host; ORS_TARGET tells the suites where it is.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.support.tooling import ensure_node_packages

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "typescript"
BIN = CLIENT / "node_modules" / ".bin"
NODE = shutil.which("node")


def suites(folder: str) -> list[str]:
    """The suites of clients/typescript/test/FOLDER, as paths from clients/typescript."""
    return sorted(str(path.relative_to(CLIENT)) for path in (CLIENT / "test" / folder).glob("*.test.ts"))


def compile_client() -> None:
    """The client compiled from its sources now (tsc type-checks src/, test/ and examples/ too)."""
    ensure_node_packages(CLIENT)
    shutil.rmtree(CLIENT / "dist", ignore_errors=True)
    result = subprocess.run([str(BIN / "tsc"), "-p", "."], cwd=CLIENT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


#: Milliseconds one test of a suite may take: a test that hangs fails by its name, and the others still run.
TEST_TIMEOUT_MS = 60_000


def run_suites(target: str, suites: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """The compiled `suites` against the server at `target`, with `env` added to the environment."""
    compiled = [f"dist/{suite.removesuffix('.ts')}.js" for suite in suites]
    return subprocess.run(
        [NODE, "--test", "--test-reporter=tap", f"--test-timeout={TEST_TIMEOUT_MS}", *compiled],
        cwd=CLIENT, env={**os.environ, "ORS_TARGET": target, **env},
        capture_output=True, text=True, timeout=150,
    )


def tap_count(output: str, name: str) -> int:
    """A TAP summary count of the suites' output (`tests`, `pass`, `fail`, `skipped`)."""
    match = re.search(rf"^# {name} (\d+)$", output, re.MULTILINE)
    assert match, output
    return int(match.group(1))
