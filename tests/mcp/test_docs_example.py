"""The first episode of docs/mcp.md runs as written, against a real server."""

from __future__ import annotations

import contextlib
import io
import textwrap
from typing import Iterator

import pytest

from tests.support.doc_snippets import code_blocks
from tests.support.servers import ROOT, ServeProcess, start_serve


@pytest.fixture(scope="module")
def arithmetic() -> Iterator[ServeProcess]:
    with start_serve("--mcp-port", "0") as serve:
        yield serve


async def test_the_first_episode_prints_the_prompt_and_reward_one(arithmetic: ServeProcess) -> None:
    (example,) = [code for language, code in code_blocks(ROOT / "docs" / "mcp.md")
                  if language == "python" and "/arithmetic/mcp?split=train&index=0" in code]
    assert "ors-grpc serve --mcp-port 8081" in example  # the server it is written for: the fixture's, on a free port
    body = textwrap.dedent(example).replace("http://localhost:8081", arithmetic.mcp_url)
    namespace: dict = {}
    exec("async def example():\n" + textwrap.indent(body, "    "), namespace)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        await namespace["example"]()
    assert printed.getvalue() == "What is 12 + 30? Use the calculator, then submit the answer. 1.0\n"
