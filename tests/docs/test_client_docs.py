"""The Python and curl examples of docs/clients.md run as written against `ors-grpc serve`
(its TypeScript example: tests/client/test_typescript.py); the reference clients'
examples print what the comments on their `print` lines say."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.doc_snippets import code_blocks, expected_prints
from tests.support.servers import ServeProcess, start_serve

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "clients.md"
#: The addresses the examples are written for (`ors-grpc serve --port 50051 --http-port 8080`).
DOC_GRPC, DOC_HTTP = "127.0.0.1:50051", "http://127.0.0.1:8080"

pytestmark = pytest.mark.timeout(120)


def examples(language: str, containing: str = "") -> list[str]:
    return [code for lang, code in code_blocks(DOC) if lang == language and containing in code]


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with start_serve("--http-port", "0") as process:  # the embedded `arithmetic` example
        yield process


def pointed_at(code: str, serve: ServeProcess) -> str:
    host, port = serve.grpc_target.rsplit(":", 1)
    return (
        code.replace(DOC_GRPC, serve.grpc_target)
        .replace('Channel("127.0.0.1", 50051)', f'Channel("{host}", {port})')
        .replace(DOC_HTTP, serve.http_url)
    )


def run(command: list[str], cwd: Path = ROOT) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.parametrize(
    ("index", "expected"),
    [(0, ["42 None False", "refused:"]), (1, ["What is 99 * 99?", "1.0"]), (2, ["What is 7 * 6?", "output 1.0"])],
    ids=["grpcio-sync", "grpcio-async", "betterproto"],
)
def test_python_examples_run(serve: ServeProcess, index: int, expected: list[str]) -> None:
    code = examples("python")[index]
    output = run([sys.executable, "-c", pointed_at(code, serve)])
    for text in expected:
        assert text in output


@pytest.mark.parametrize("client", ["from ors.client import ORS", "from openreward import AsyncEnvironmentsAPI"])
def test_the_reference_clients_run_unmodified(serve: ServeProcess, client: str) -> None:
    (code,) = examples("python", containing=client)
    assert run([sys.executable, "-c", pointed_at(code, serve)]).splitlines() == expected_prints(code)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_example_runs(serve: ServeProcess) -> None:
    (code,) = examples("bash", containing="$ORS")
    output = run(["bash", "-euo", "pipefail", "-c", pointed_at(code, serve)])
    assert '"ok":true' in output and '"reward":1.0,"finished":true' in output
