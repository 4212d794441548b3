"""The README's environment and gRPC client snippets run as written."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from tests.support.servers import ROOT, start_serve


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)


def test_readme_environment_and_client_session(tmp_path: Path) -> None:
    environment = next(block for block in _python_blocks() if "class GuessEnv" in block)
    client = next(block for block in _python_blocks() if "EnvironmentServiceStub" in block)
    (tmp_path / "guess_env.py").write_text(environment)
    with start_serve("guess_env:GuessEnv", env={"PYTHONPATH": str(tmp_path)}) as serve:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(client.replace("localhost:50051", serve.grpc_target), "README client", "exec"), {})
    assert printed.getvalue().splitlines() == ["Guess my number between 1 and 10.", "guessed 7, reward 1.0"]
