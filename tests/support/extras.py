"""Which of the project's extras this test environment has."""

from __future__ import annotations

import importlib.util

#: The MCP door's SDK (the `mcp` extra). The README's test environment does not
#: have it: it holds openreward, whose sse-starlette pin excludes the SDK
#: (pyproject.toml); tests/mcp run where it is installed
#: (tests/environments/test_mcp_door_tests.py).
MCP_EXTRA_INSTALLED = importlib.util.find_spec("mcp") is not None
