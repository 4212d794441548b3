"""An environment that forks per episode under `ors-grpc serve`: gRPC's fork
handlers are off there (GRPC_ENABLE_FORK_SUPPORT=0 unless set), so forks
neither log "skipping fork() handlers" nor disturb the server. In worker
processes (the default) the forks happen where no gRPC runs; the handlers
matter where environments' code shares the server's process (`--in-process`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ors_grpc.client import AsyncORSClient
from tests.support.servers import start_serve

pytestmark = pytest.mark.timeout(120)
SKIPPING_FORK_HANDLERS = "skipping fork() handlers"


async def _episodes(target: str, count: int) -> list[str]:
    prompts = []
    async with AsyncORSClient(target) as client:
        for _ in range(count):
            async with client.environment("forkingenv").session({"id": 0}) as session:
                prompts.append((await session.get_prompt())[0].text)
    return prompts


def _serve_episodes(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[list[str], str]:
    log = tmp_path / "stderr.log"
    with open(log, "w") as stderr, start_serve("tests.support.forking_env:ForkingEnv", *args, env=env,
                                               stderr=stderr) as serve:
        prompts = asyncio.run(_episodes(serve.grpc_target, 3))
    return prompts, log.read_text()


@pytest.mark.parametrize("args", [(), ("--in-process",)], ids=["default", "in-process"])
def test_episodes_that_fork_run_without_grpc_fork_handler_noise(tmp_path: Path, args: tuple[str, ...]) -> None:
    prompts, stderr = _serve_episodes(tmp_path, {"GRPC_VERBOSITY": "INFO"}, *args)
    assert len(prompts) == 3 and all(prompt.startswith("forked in ") for prompt in prompts)
    assert SKIPPING_FORK_HANDLERS not in stderr


def test_a_user_setting_of_fork_support_is_kept(tmp_path: Path) -> None:
    """With fork support asked for, gRPC's handlers run (and say why they skip):
    the server's default does not override the user's choice."""
    prompts, stderr = _serve_episodes(tmp_path, {"GRPC_ENABLE_FORK_SUPPORT": "1", "GRPC_VERBOSITY": "INFO"},
                                      "--in-process")
    assert len(prompts) == 3
    assert SKIPPING_FORK_HANDLERS in stderr
