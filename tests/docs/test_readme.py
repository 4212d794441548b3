"""Every code block of README.md runs as written, against `ors-grpc serve` on free ports.

The blocks are found by what they hold (`SNIPPETS`); a block none of them
names fails, so a new snippet cannot go untested. Each ```python block must
print what the comments on its `print` lines say, in order. The README's test
command is the one `.ci/run` runs (tests/docs/test_ci_script.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from ors_grpc.client import ORSClient
from tests.support.doc_snippets import code_blocks, expected_prints
from tests.support.servers import ROOT, SERVE_APP_ON_A_FREE_PORT, ServeProcess, start_script_server, start_serve
from tests.support.tooling import grpcurl

README = ROOT / "README.md"
MAX_LINES = 150
#: The addresses the blocks are written for.
README_GRPC, README_HTTP = "localhost:50051", "http://localhost:8080"
#: The first command of the README, exactly: install, then serve the example on both doors.
INSTALL_AND_SERVE = "pip install . && ors-grpc serve --port 50051 --http-port 8080"
#: Every block, by (language, a text only it holds).
SNIPPETS = {
    "install and serve": ("bash", INSTALL_AND_SERVE),
    "curl episode": ("bash", "curl -s"),
    "ors.client episode": ("python", "from ors.client import ORS"),
    "ORSClient episode": ("python", "from ors_grpc.client import ORSClient"),
    "grpcurl episode": ("bash", "grpcurl -plaintext"),
    "own environment": ("python", "class GuessEnv(Environment)"),
    "serve own environment": ("bash", "ors-grpc serve guess_env:GuessEnv"),
    "test command": ("bash", "pytest"),  # run by .ci/run: tests/docs/test_ci_script.py
}

pytestmark = pytest.mark.timeout(120)


def blocks() -> list[tuple[str, str]]:
    return code_blocks(README)


def snippet(name: str) -> str:
    language, marker = SNIPPETS[name]
    (code,) = [code for lang, code in blocks() if lang == language and marker in code]
    return code


def pointed_at(code: str, serve: ServeProcess) -> str:
    return code.replace(README_GRPC, serve.grpc_target).replace(README_HTTP, serve.http_url)


def run(command: list[str], **kwargs) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, **kwargs)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def serve_args(command: str) -> list[str]:
    """The `ors-grpc serve` arguments of a README command, on free ports."""
    words = command.rpartition("ors-grpc serve ")[2].split()
    for option in ("--port", "--http-port"):
        words[words.index(option) + 1] = "0"
    return words


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with start_serve(*serve_args(INSTALL_AND_SERVE)) as process:
        yield process


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_the_first_block_installs_and_serves_the_example() -> None:
    assert blocks()[0] == ("bash", INSTALL_AND_SERVE + "\n")


def test_every_block_is_one_this_module_runs() -> None:
    named = [name for language, code in blocks() for name, (lang, marker) in SNIPPETS.items()
             if lang == language and marker in code]
    assert sorted(named) == sorted(SNIPPETS), "each block must hold exactly one SNIPPETS marker, and each marker one block"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_curl_episode(serve: ServeProcess) -> None:
    code = snippet("curl episode")
    (answer,) = re.findall(r"^# event: end, data: (.*)$", code, re.MULTILINE)
    output = run(["bash", "-euo", "pipefail", "-c", pointed_at(code, serve)])
    assert "What is 12 + 30?" in output
    assert f"event: end\ndata: {answer}\n" in output


@pytest.mark.parametrize("name", ["ors.client episode", "ORSClient episode"])
def test_the_python_episodes(serve: ServeProcess, name: str) -> None:
    code = snippet(name)
    assert run([sys.executable, "-c", pointed_at(code, serve)]).splitlines() == expected_prints(code)


def test_the_grpcurl_episode(serve: ServeProcess) -> None:
    binary = Path(grpcurl())
    output = run(["bash", "-euo", "pipefail", "-c", pointed_at(snippet("grpcurl episode"), serve)],
                 env={"PATH": f"{binary.parent}:/usr/bin:/bin"})
    assert "ors.v1.EnvironmentService.CallTool is a method:" in output  # by reflection
    assert '"text": "Correct!"' in output and '"reward": 1,' in output and '"finished": true' in output


def play_guesses(session) -> list[tuple[str, float | None, bool]]:
    """Guess 5, then 7, in an episode of the README's environment on task 1 (secret 7)."""
    return [
        (result.blocks[0].text, result.reward, result.finished)
        for result in (session.call_tool("guess", {"number": number}) for number in (5, 7))
    ]


def test_the_own_environment_is_served_as_written(tmp_path: Path) -> None:
    (tmp_path / "guess_env.py").write_text(snippet("own environment"))
    with start_serve(*serve_args(snippet("serve own environment")), env={"PYTHONPATH": str(tmp_path)}) as serve:
        with ORSClient(serve.grpc_target) as client:
            with client.environment("guessenv").session(split="train", index=1) as session:
                assert session.get_prompt()[0].text == "Guess my number between 1 and 10."
                assert play_guesses(session) == [("higher", 0.0, False), ("correct", 1.0, True)]


# Serves guess_env.py with a reference SDK's own Server; argv[1]: the module holding `Server`.
REFERENCE_SERVER = """
import importlib, os, socket, sys
import uvicorn
from guess_env import GuessEnv
server = importlib.import_module(sys.argv[1]).Server([GuessEnv])
""" + SERVE_APP_ON_A_FREE_PORT


@pytest.mark.parametrize("sdk", ["ors", "openreward.environments"])
def test_the_own_environment_runs_under_the_reference_sdks_with_their_import(sdk: str, tmp_path: Path) -> None:
    from ors.client import ORS

    source = snippet("own environment")
    assert "from ors_grpc import " in source
    (tmp_path / "guess_env.py").write_text(source.replace("from ors_grpc import ", f"from {sdk} import "))
    with start_script_server(REFERENCE_SERVER, sdk, name=f"{sdk} server", workdir=tmp_path) as url:
        with ORS(base_url=url) as client:
            with client.environment("guessenv").session(split="train", index=1) as session:
                assert session.get_prompt()[0].text == "Guess my number between 1 and 10."
                assert play_guesses(session) == [("higher", 0.0, False), ("correct", 1.0, True)]
