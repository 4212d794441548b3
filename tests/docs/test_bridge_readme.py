"""The README's HTTP quickstart (curl, ors.client and openreward) runs as written against `ors-grpc serve --http-port`."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
from typing import Iterator

import pytest

from tests.support.servers import ROOT, ServeProcess, start_serve

README_URL = "http://localhost:8080"


def _quickstart() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## HTTP quickstart", 1)[1].split("\n## ", 1)[0]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", _quickstart(), re.DOTALL)


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with start_serve("--http-port", "0") as process:  # the embedded example, as in the README
        yield process


def test_the_quickstart_starts_the_example_with_both_doors() -> None:
    assert _blocks("bash")[0].strip() == "ors-grpc serve --port 50051 --http-port 8080"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_curl_episode(serve: ServeProcess) -> None:
    script = _blocks("bash")[1].replace(README_URL, serve.http_url)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"text":"42"' in done.stdout
    assert '{"text":"Correct!","detail":null,"type":"text"}],"metadata":null,"reward":1.0,"finished":true}' in done.stdout


def test_the_ors_client_episode(serve: ServeProcess) -> None:
    client = next(block for block in _blocks("python") if "from ors.client import" in block)
    client = client.replace(README_URL, serve.http_url)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(client, "README HTTP quickstart", "exec"), {})
    assert printed.getvalue().splitlines() == [
        "['train', 'test']",
        "['calculator', 'submit']",
        "What is 12 + 30? Use the calculator, then submit the answer.",
        "42",
        "Correct! 1.0 True",
    ]


def test_the_openreward_client_episode(serve: ServeProcess) -> None:
    client = next(block for block in _blocks("python") if "from openreward import" in block)
    done = subprocess.run(
        [sys.executable, "-c", client.replace(README_URL, serve.http_url)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "['train', 'test']",
        "What is 12 + 30? Use the calculator, then submit the answer.",
        "42",
        "Correct! 1.0 True",
    ]
