"""Every example of docs/authoring.md runs as written, under ours and under openreward's server.

Each ```python block starting `# file: NAME.py` is saved under that name; each
starting `# with: ors-grpc serve ...` runs against that command's server (on
free ports, the saved files importable) and must print what the comments on
its `print` lines say, in order. Every ```bash block is one of those commands.

The page says the examples run under their original SDK with its import: each
`# with:` block also runs against `openreward.environments.Server` hosting the
same files with `from openreward.environments import` (session toolsets
registered as its built-in ones are, the setup wait bounded the same), and
must print the same.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.doc_snippets import code_blocks, expected_prints
from tests.support.servers import ROOT, SERVE_APP_ON_A_FREE_PORT, start_script_server, start_serve

DOC = ROOT / "docs" / "authoring.md"
#: The address the examples are written for (`--http-port 8080`).
DOC_HTTP = "http://localhost:8080"

pytestmark = pytest.mark.timeout(180)


def blocks(language: str) -> list[str]:
    return [code for lang, code in code_blocks(DOC) if lang == language]


def files() -> dict[str, str]:
    found = {}
    for code in blocks("python"):
        first, _, rest = code.partition("\n")
        if first.startswith("# file: "):
            found[first.removeprefix("# file: ")] = code
    return found


def runs() -> list[tuple[str, str]]:
    """(the server command, the code) of every `# with:` block."""
    found = []
    for code in blocks("python"):
        first = code.partition("\n")[0]
        if first.startswith("# with: "):
            found.append((first.removeprefix("# with: "), code))
    return found


def test_every_python_block_is_a_file_or_a_run() -> None:
    assert len(files()) + len(runs()) == len(blocks("python"))
    assert len(runs()) >= 6


def test_every_bash_block_is_a_tested_command() -> None:
    commands = {command for command, _ in runs()}
    for code in blocks("bash"):
        assert code.strip() in commands, code


def serve_args(command: str) -> list[str]:
    words = command.split()
    assert words[:2] == ["ors-grpc", "serve"], command
    args = words[2:]
    args[args.index("--http-port") + 1] = "0"
    return args


# Serves the examples' environments with openreward's server; argv: the
# `ors-grpc serve` arguments. Announces its port like `ors-grpc serve`.
OPENREWARD_SERVER = """
import os, socket, sys, types
from pathlib import Path
import uvicorn
import openreward.toolsets
import openreward.environments.server as server_module

def load(spec):
    module_name, _, class_name = spec.partition(":")
    if module_name not in sys.modules:
        source = Path(module_name + ".py").read_text()
        source = source.replace("from ors_grpc import", "from openreward.environments import")
        module = sys.modules[module_name] = types.ModuleType(module_name)
        exec(compile(source, module_name + ".py", "exec"), module.__dict__)
    return getattr(sys.modules[module_name], class_name)

args, environments = sys.argv[1:], []
while args:
    word = args.pop(0)
    if word == "--toolset":
        toolset = load(args.pop(0))
        openreward.toolsets.BUILTIN_TOOLSETS[toolset.name()] = toolset
    elif word == "--setup-wait":
        server_module._SETUP_WAIT_TIMEOUT_S = float(args.pop(0))
    elif word == "--http-port":
        args.pop(0)
    else:
        environments.append(load(word))
server = server_module.Server(environments)
""" + SERVE_APP_ON_A_FREE_PORT


@contextlib.contextmanager
def openreward_server(args: list[str], workdir: Path) -> Iterator[str]:
    with start_script_server(OPENREWARD_SERVER, *args, name="openreward server", workdir=workdir) as url:
        yield url


@contextlib.contextmanager
def ours(args: list[str], workdir: Path) -> Iterator[str]:
    with start_serve(*args, env={"PYTHONPATH": str(workdir)}) as serve:
        yield serve.http_url


SERVERS = {"ours": ours, "openreward": openreward_server}


@pytest.mark.parametrize("server", list(SERVERS))
@pytest.mark.parametrize(("command", "code"), runs(), ids=[command for command, _ in runs()])
def test_example_runs(server: str, command: str, code: str, tmp_path: Path) -> None:
    for name, text in files().items():
        (tmp_path / name).write_text(text)
    expected = expected_prints(code)
    with SERVERS[server](serve_args(command), tmp_path) as url:
        result = subprocess.run(
            [sys.executable, "-c", code.replace(DOC_HTTP, url)],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == expected
