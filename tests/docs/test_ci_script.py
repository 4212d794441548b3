"""`.ci/run` runs the README's own test command (environments' code in worker processes, the
default), the heavy suites it leaves out, then the in-process pass over test files that exist (heavy ones
included)."""

from __future__ import annotations

import re

from tests.conftest import HEAVY_SUITES
from tests.support.servers import ROOT

CI_SCRIPT = ROOT / ".ci" / "run"


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index("Run the tests"):]
    return re.search(r"```bash\n(.*?)\n```", after, re.DOTALL).group(1)


def test_ci_runs_the_readmes_test_command_as_written() -> None:
    command = _readme_test_command()
    assert "pytest" in command
    assert command in CI_SCRIPT.read_text().splitlines()


def test_the_in_process_pass_names_test_files_that_exist_outside_tests_workers() -> None:
    script = CI_SCRIPT.read_text()
    files = re.search(r'^ENVIRONMENT_CODE_TESTS="(.*?)"$', script, re.DOTALL | re.MULTILINE).group(1).split()
    assert files
    assert [path for path in files if not (ROOT / path).exists()] == []  # files, or a folder of them
    assert [path for path in files if path.startswith("tests/workers/")] == []  # they choose their own modes
    assert 'ORS_TEST_SERVE_ARGS="--in-process" pytest -q -m \'not slow\' $ENVIRONMENT_CODE_TESTS' in script


def test_ci_runs_every_marker_the_readmes_command_leaves_out() -> None:
    lines = CI_SCRIPT.read_text().splitlines()
    pyproject = (ROOT / "pyproject.toml").read_text()
    left_out = re.search(r"^addopts = \"-m '(.*?)'", pyproject, re.MULTILINE).group(1)
    assert re.findall(r"not (\w+)", left_out) == ["slow", "heavy"]
    assert "pytest -m 'heavy and not slow'" in lines and "pytest -m slow" in lines


def test_the_heavy_suites_exist() -> None:
    assert [suite for suite in HEAVY_SUITES if not (ROOT / suite.partition("::")[0]).is_file()] == []
