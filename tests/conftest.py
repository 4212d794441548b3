"""Shared fixtures: a stub onto an ORS gRPC server on loopback, the
ORS_TESTS_NO_SKIP policy, and which suites are `heavy`. Helpers live in `tests.support`."""

from __future__ import annotations

import os
import re
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

#: Suites the README's test command (`pytest`) leaves out for time, marked `heavy` (a file, or test
#: ids within one, `*` any text):
#: `.ci/run` runs them with `pytest -m heavy` (and, where they start `serve`, in worker mode).
#: Each starts what takes seconds to start or run: a real browser, load balancers (nginx, HAProxy, Envoy)
#: in front of several servers, other languages' toolchains (Go, Java, Node.js), the benchmark,
#: a virtualenv of its own (the MCP door's tests), faults that kill worker processes, or the
#: documentation's examples once more under openreward's own server.
HEAVY_SUITES = (
    "tests/playground/test_playground_browser.py",
    "tests/playground/test_browser_origins.py",
    "tests/deploy/test_drain.py",
    "tests/deploy/test_envoy.py",
    "tests/deploy/test_haproxy.py",
    "tests/deploy/test_scaleout.py",
    "tests/deploy/test_warm_routing.py",
    "tests/client/test_generation.py",
    "tests/client/test_typescript.py",
    "tests/cli/test_bench_smoke.py",
    "tests/environments/test_mcp_door_tests.py",
    "tests/workers/test_worker_faults.py",
    "tests/workers/test_stalls.py",
    "tests/docs/test_authoring_docs.py::test_example_runs[*-openreward]",
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HEAVY.fullmatch(item.nodeid):
            item.add_marker(pytest.mark.heavy)


_HEAVY = re.compile("|".join(re.escape(suite).replace(r"\*", ".*") + "(::.*)?" for suite in HEAVY_SUITES))


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
