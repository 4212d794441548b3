"""The README's three-line MCP example runs as written, against a real server."""

from __future__ import annotations

import contextlib
import io
import re
import textwrap
from typing import Iterator

import pytest

from tests.support.servers import ROOT, ServeProcess, start_serve


@pytest.fixture(scope="module")
def arithmetic() -> Iterator[ServeProcess]:
    with start_serve("--mcp-port", "0") as serve:
        yield serve


async def test_the_readme_mcp_example_prints_the_prompt_and_reward_one(arithmetic: ServeProcess) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    example = textwrap.dedent(next(block for block in blocks if "from mcp import Client" in block))
    body = example.replace("http://localhost:8081", arithmetic.mcp_url)
    namespace: dict = {}
    exec("async def example():\n" + textwrap.indent(body, "    "), namespace)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        await namespace["example"]()
    assert printed.getvalue() == "What is 12 + 30? Use the calculator, then submit the answer. 1.0\n"
