"""The Node.js client (clients/node, @grpc/grpc-js on the .proto files) runs a full episode
against `ors-grpc serve`. Its packages are installed with `npm ci` when missing (tests/tooling.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.servers import start_serve
from tests.tooling import NPM_CI_TIMEOUT_S, ensure_node_packages

ROOT = Path(__file__).resolve().parent.parent
NODE_CLIENT = ROOT / "clients" / "node"
NODE = shutil.which("node")

pytestmark = [pytest.mark.timeout(NPM_CI_TIMEOUT_S + 90), pytest.mark.skipif(NODE is None, reason="node is not installed")]


@pytest.fixture(autouse=True, scope="module")
def node_packages() -> None:
    ensure_node_packages(NODE_CLIENT)


def run_episode(target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [NODE, str(NODE_CLIENT / "episode.js"), target],
        capture_output=True, text=True, timeout=60,
    )


def test_node_client_full_episode() -> None:
    with start_serve("tests.environments:EchoEnv") as serve:
        result = run_episode(serve.grpc_target)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok - image block carries raw bytes, mime type and detail" in result.stdout
    assert "ok - an unknown tool is a tool-level error" in result.stdout
    assert "ok - RunEpisode: a failed step answers with a StepError and the stream goes on" in result.stdout
    assert "ok - RunEpisode: the delete step ends the episode" in result.stdout
    assert result.stdout.rstrip().endswith("episode complete")


def test_node_client_exits_non_zero_on_a_mismatch() -> None:
    # A server hosting only the example environment has no `echoenv`: the first checks fail.
    with start_serve() as serve:
        result = run_episode(serve.grpc_target)
    assert result.returncode != 0
    assert "not ok" in result.stderr
