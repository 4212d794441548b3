"""Shared fixtures: a stub onto an ORS gRPC server on loopback, and the
ORS_TESTS_NO_SKIP policy. Helpers live in `tests.support`."""

from __future__ import annotations

import os
from typing import Any, AsyncIterator

import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from tests.support.extras import MCP_EXTRA_INSTALLED
from tests.support.grpc_calls import serving
from tests.support.tooling import NO_SKIP_ENV

#: The MCP door's tests (tests/mcp) need the `mcp` extra, which the README's test
#: environment cannot hold beside openreward (pyproject.toml says why). Where it is
#: missing they run in a virtualenv that has it (tests/environments/test_mcp_door_tests.py);
#: where it is installed, here.
collect_ignore = ["environments/test_mcp_door_tests.py"] if MCP_EXTRA_INSTALLED else ["mcp"]


@pytest.fixture
async def stub() -> AsyncIterator[pb_grpc.EnvironmentServiceStub]:
    """A stub onto a default-configured server hosting the test environments."""
    async with serving() as stub:
        yield stub


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Under ORS_TESTS_NO_SKIP=1 (set by .ci/run) a skipped test fails, with its skip reason."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get(NO_SKIP_ENV) == "1" and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, but {NO_SKIP_ENV}=1 makes every skip a failure: " + reason.removeprefix("Skipped: ")
