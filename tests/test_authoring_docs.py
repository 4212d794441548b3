"""Every example of docs/authoring.md runs as written.

Each ```python block starting `# file: NAME.py` is saved under that name; each
starting `# with: ors-grpc serve ...` runs against that command's server (on
free ports, the saved files importable) and must print what the comments on
its `print` lines say, in order. Every ```bash block is one of those commands.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import ROOT, start_serve

DOC = ROOT / "docs" / "authoring.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: The address the examples are written for (`--http-port 8080`).
DOC_HTTP = "http://localhost:8080"
#: `print(...)  # what it prints`
EXPECTED = re.compile(r"^\s*print\(.*\)  # (.*)$")

pytestmark = pytest.mark.timeout(180)


def blocks(language: str) -> list[str]:
    return [code for lang, code in FENCE.findall(DOC.read_text()) if lang == language]


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


@pytest.mark.parametrize(("command", "code"), runs(), ids=[command for command, _ in runs()])
def test_example_runs(command: str, code: str, tmp_path: Path) -> None:
    for name, text in files().items():
        (tmp_path / name).write_text(text)
    expected = [match.group(1) for match in map(EXPECTED.match, code.splitlines()) if match]
    with start_serve(*serve_args(command), env={"PYTHONPATH": str(tmp_path)}) as serve:
        result = subprocess.run(
            [sys.executable, "-c", code.replace(DOC_HTTP, serve.http_url)],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == expected
