"""The MCP door's tests (tests/mcp) where the README's test environment runs
them: it holds openreward, whose sse-starlette pin excludes the MCP SDK
(pyproject.toml), so they run in a virtualenv of their own with the
`test-mcp` extra, as a user of the door installs it (`.venv-mcp`, built
once per pyproject.toml, `pip check` clean), one pytest run a module. The
OpenEnv adapter's tests are there too (tests/mcp/test_openenv.py): openenv-core
needs the same MCP stack. Where the `mcp` extra is installed, tests/conftest.py
collects tests/mcp directly instead of this."""

from __future__ import annotations

import pytest

from tests.support.servers import ROOT
from tests.support.virtualenvs import PIP_INSTALL_TIMEOUT_S, Virtualenv, mcp_test_environment

MODULES = sorted(path.name for path in (ROOT / "tests" / "mcp").glob("test_*.py"))
#: A module's run, after the environment is built (its first test builds it).
MODULE_RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def mcp_env() -> Virtualenv:
    return mcp_test_environment()


@pytest.mark.timeout(PIP_INSTALL_TIMEOUT_S + MODULE_RUN_TIMEOUT_S)
@pytest.mark.parametrize("module", MODULES)
def test_the_mcp_door_tests_pass_where_the_mcp_extra_is_installed(mcp_env: Virtualenv, module: str) -> None:
    done = mcp_env.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/mcp/{module}",
                       timeout=MODULE_RUN_TIMEOUT_S)
    assert done.returncode == 0, f"pytest tests/mcp/{module} in {mcp_env.path}:\n{done.stdout[-8000:]}{done.stderr[-2000:]}"
    assert " passed" in done.stdout.splitlines()[-1], done.stdout[-2000:]
