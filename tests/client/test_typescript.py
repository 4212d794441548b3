"""The TypeScript client (clients/typescript) against `ors-grpc serve`.

Runs the client's own node:test suites against real servers: clients/typescript/test/echoenv/
(discovery, full episodes by RPC and on RunEpisode streams, reattach through a breaking proxy,
API key, TLS) against one hosting EchoEnv, test/openrewardenv/ (messages, terminal tool,
toolsets, group scoring) against one hosting OpenRewardEnv, test/gatedsetupenv/ (calls while
the environment is still starting) against one hosting GatedSetupEnv, test/countingwarmenv/
(warm episodes, exactly-once tool calls) against one hosting CountingWarmEnv; checks that the generated code
(src/gen/) is what protoc-gen-es makes from proto/ now, and runs the example that
docs/clients.md shows.

They need node; the client's packages are installed with `npm ci` when missing
(tests/support/tooling.py: without node they skip and say why, and under ORS_TESTS_NO_SKIP=1,
as `.ci/run` sets, they fail instead).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.doc_snippets import code_blocks
from tests.support.servers import ServeProcess, start_serve
from tests.support.tooling import NPM_CI_TIMEOUT_S, ensure_node_packages
from tests.support.typescript import BIN, CLIENT, compile_client, suites, tap_count
from tests.support.typescript import run_suites as run_node_suites
from tests.support.warm_environments import MARKER_DIR_VARIABLE

ROOT = Path(__file__).resolve().parents[2]

EXAMPLE = CLIENT / "examples" / "quickstart.ts"
EXAMPLE_COMMAND = "cd clients/typescript && npm ci && node dist/examples/quickstart.js"

pytestmark = pytest.mark.timeout(NPM_CI_TIMEOUT_S + 180)  # the first test may run `npm ci`


@pytest.fixture(scope="module")
def built() -> None:
    compile_client()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1, and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def run_suites(serve: ServeProcess, suites: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return run_node_suites(serve.grpc_target, suites, **env)


@pytest.fixture(params=["plain", "api-key", "tls"])
def mode(request: pytest.FixtureRequest, certificate: tuple[Path, Path]) -> Iterator[tuple[ServeProcess, dict[str, str]]]:
    """A server hosting EchoEnv as the client suites expect it, and the environment telling them how to reach it."""
    cert, key = certificate
    args, env = {
        "plain": ([], {}),
        "api-key": (["--api-key", "ts-client-key"], {"ORS_API_KEY": "ts-client-key"}),
        "tls": (["--tls-cert", str(cert), "--tls-key", str(key)], {"ORS_TLS_CA": str(cert)}),
    }[request.param]
    with start_serve("tests.support.environments:EchoEnv", *args) as serve:
        yield serve, env


def test_client_suites_pass(built: None, mode: tuple[ServeProcess, dict[str, str]]) -> None:
    serve, env = mode
    result = run_suites(serve, suites("echoenv"), **env)
    assert result.returncode == 0, result.stdout + result.stderr
    # auth.test.ts holds one test for the API key and one for TLS: each runs only in its mode.
    skipped = 2 if not env else 1
    assert tap_count(result.stdout, "skipped") == skipped, result.stdout
    assert tap_count(result.stdout, "pass") == tap_count(result.stdout, "tests") - skipped > 10, result.stdout
    for name in ["prompt, tools, outputs, refusals", "a failed step answers with its error", "a stream broken while the tool runs"]:
        assert re.search(rf"^\s*ok \d+ - {re.escape(name)}", result.stdout, re.MULTILINE), name


def test_openreward_suites_pass(built: None) -> None:
    environment, toolset = "tests.support.openreward_dialect_env:OpenRewardEnv", "tests.support.openreward_dialect_env:GraderToolset"
    with start_serve(environment, "--toolset", toolset) as serve:
        result = run_suites(serve, suites("openrewardenv"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert tap_count(result.stdout, "pass") == tap_count(result.stdout, "tests") > 3, result.stdout


def test_calls_while_the_environment_starts_are_asked_again(built: None, tmp_path: Path) -> None:
    gate = {"ORS_TEST_SETUP_GATE": str(tmp_path / "setup-gate")}  # the suite creates it: setup ends
    with start_serve("tests.support.gated_setup_env:GatedSetupEnv", "--setup-wait", "0.2", env=gate) as serve:
        result = run_suites(serve, suites("gatedsetupenv"), **gate)
    assert result.returncode == 0, result.stdout + result.stderr
    assert tap_count(result.stdout, "pass") == tap_count(result.stdout, "tests") > 0, result.stdout


def test_warm_episode_and_exactly_once_suites_pass(built: None, tmp_path: Path) -> None:
    markers = {MARKER_DIR_VARIABLE: str(tmp_path)}  # the server records its setups there, the suite reads them
    with start_serve("tests.support.counting_warm_env:CountingWarmEnv", env=markers) as serve:
        result = run_suites(serve, suites("countingwarmenv"), **markers)
    assert result.returncode == 0, result.stdout + result.stderr
    assert tap_count(result.stdout, "pass") == tap_count(result.stdout, "tests") > 4, result.stdout


def test_the_call_in_flight_when_its_process_dies_is_environment_crashed(built: None) -> None:
    with start_serve("tests.support.crash_report_env:CrashReportEnv") as serve:
        result = run_suites(serve, suites("crashreportenv"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert tap_count(result.stdout, "pass") == tap_count(result.stdout, "tests") == 2, result.stdout


def test_client_suites_fail_against_a_server_without_echoenv(built: None) -> None:
    with start_serve() as serve:  # only the embedded `arithmetic`
        result = run_suites(serve, ["test/echoenv/episode.test.ts"])
    assert result.returncode != 0
    assert tap_count(result.stdout, "fail") > 0
    assert re.search(r"^not ok \d+ - discovery$", result.stdout, re.MULTILINE), result.stdout


def _files(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    ensure_node_packages(CLIENT)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}  # protoc-gen-es, the local plugin
    subprocess.run(
        [str(BIN / "buf"), "generate", "--template", "buf.gen.yaml", "--output", str(tmp_path)],
        cwd=CLIENT, env=env, check=True, timeout=120,
    )
    fresh, committed = _files(tmp_path / "src" / "gen"), _files(CLIENT / "src" / "gen")
    assert sorted(fresh) == sorted(committed), "generated file set differs: run `npm run generate` in clients/typescript"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated files {stale}: run `npm run generate` in clients/typescript"


def test_the_page_shows_the_example_and_how_to_run_it() -> None:
    page = ROOT / "docs" / "clients.md"
    assert EXAMPLE_COMMAND in page.read_text()
    typescript = [code for language, code in code_blocks(page) if language == "typescript"]
    assert EXAMPLE.read_text() in typescript, "docs/clients.md must show examples/quickstart.ts as it is"


def test_the_example_runs_as_the_page_says(built: None) -> None:
    folder, install, run = (part.strip() for part in EXAMPLE_COMMAND.split("&&"))
    assert (folder, install) == ("cd clients/typescript", "npm ci")  # the install is the module's `built`
    with start_serve() as serve:  # `ors-grpc serve --port 50051`, but on a free port: the example reads ORS_TARGET
        result = subprocess.run(
            run.split(), cwd=ROOT / folder.removeprefix("cd "), env={**os.environ, "ORS_TARGET": serve.grpc_target},
            capture_output=True, text=True, timeout=60,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "[ { name: 'train', type: 'train' }, { name: 'test', type: 'test' } ]",
        "What is 12 + 30? Use the calculator, then submit the answer.",
        "42",
        "refused: 'no_such_tool' is not a valid tool",
        "1 true",
        "1 true",
    ], result.stdout
