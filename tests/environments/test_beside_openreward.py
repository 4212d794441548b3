"""A user who has openreward installs ors-grpc beside it: in a fresh
virtualenv one `pip install` of the project's wheel and `openreward`
resolves, `pip check` is clean and both import; an environment written for
`openreward.environments` serves under `ors-grpc serve` once its import line
is swapped, and openreward's own client plays an episode on it; and
`--mcp-port`, whose SDK is the `mcp` extra, says what to install."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support import openreward_dialect_env
from tests.support.servers import run_serve
from tests.support.virtualenvs import PIP_INSTALL_TIMEOUT_S, Virtualenv, create
from tests.support.wheel import build_wheel

#: openreward's newest release when this was written: the one install must not
#: reach a resolution by backtracking to an older openreward.
NEWEST_OPENREWARD = (0, 1, 167)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(PIP_INSTALL_TIMEOUT_S + 600)]

#: The one import line an author changes to move an environment (at a line's start).
FROM_ORS_GRPC = "\nfrom ors_grpc import"
FROM_OPENREWARD = "\nfrom openreward.environments import"

#: Run by the virtualenv's Python: openreward's client plays one episode on the served environment.
EPISODE = textwrap.dedent("""
    import asyncio, sys
    from openreward.api.environments.client import AsyncEnvironmentsAPI

    async def main(url):
        api = AsyncEnvironmentsAPI(base_url=url, api_key="")
        env = api.get("openrewardenv")
        (task, _) = await env.list_tasks("train")
        async with env.session(task=task) as session:
            prompt = await session.get_prompt()
            print("prompt:", " | ".join(block.text for block in prompt if block.type == "text"))
            result = await session.call_tool("submit", {"answer": "4"})
            print("submit:", result.blocks[0].text, result.reward, result.finished)

    asyncio.run(main(sys.argv[1]))
""")


@pytest.fixture(scope="module")
def beside_openreward(tmp_path_factory: pytest.TempPathFactory) -> Virtualenv:
    folder = tmp_path_factory.mktemp("beside-openreward")
    wheel = build_wheel(folder / "dist")
    venv = create(folder / "venv")
    venv.pip_install(str(wheel), "openreward")  # one resolution; then `pip check`
    return venv


def test_one_install_holds_both_and_pip_check_is_clean(beside_openreward: Virtualenv) -> None:
    assert beside_openreward.pip_check().strip() == "No broken requirements found."
    done = beside_openreward.run("python", "-c", textwrap.dedent("""
        import importlib.metadata as metadata
        import ors_grpc, http_bridge, openreward, openreward.environments
        print(metadata.version("openreward"), metadata.version("sse-starlette"))
    """))
    assert done.returncode == 0, done.stderr
    openreward_version, sse_starlette_version = done.stdout.split()
    assert tuple(int(part) for part in openreward_version.split(".")[:3]) >= NEWEST_OPENREWARD
    assert sse_starlette_version == "2.3.6"  # openreward's pin, unbroken


def test_an_environment_written_for_openreward_serves_with_its_import_swapped(
    beside_openreward: Virtualenv, tmp_path: Path
) -> None:
    source = Path(openreward_dialect_env.__file__).read_text()
    written_for_openreward = source.replace(FROM_ORS_GRPC, FROM_OPENREWARD)
    assert written_for_openreward.count(FROM_OPENREWARD) == 1 and FROM_ORS_GRPC not in written_for_openreward
    (tmp_path / "migrated_env.py").write_text(written_for_openreward.replace(FROM_OPENREWARD, FROM_ORS_GRPC))
    (tmp_path / "episode.py").write_text(EPISODE)
    command = [beside_openreward.bin("ors-grpc"), "serve", "migrated_env:OpenRewardEnv", "--port", "0", "--http-port", "0"]
    with run_serve(command, cwd=tmp_path, env={**beside_openreward.environ, "PYTHONPATH": str(tmp_path)}) as serve:
        done = beside_openreward.run("python", "episode.py", serve.http_url, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    prompt, submit = done.stdout.splitlines()
    assert prompt.startswith("prompt: ") and " | What is 2+2? | " in prompt, prompt  # the first task's messages
    assert submit == "submit: correct 1.0 True"


def test_the_mcp_door_names_the_extra_to_install(beside_openreward: Virtualenv) -> None:
    done = beside_openreward.run("ors-grpc", "serve", "--port", "0", "--mcp-port", "0")
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    # Installed from a wheel: the command adds the extra to that very wheel.
    [line] = done.stderr.splitlines()
    prefix = ("ors-grpc serve: error: the MCP door (--mcp-port) needs the mcp extra, which is not installed"
              " (missing: the MCP SDK 'mcp'): pip install '")
    assert line.startswith(prefix) and line.endswith(".whl[mcp]'"), line
    assert Path(line.removeprefix(prefix).removesuffix("[mcp]'")).is_file(), line
