"""Servers for the playground's tests: `ors-grpc serve` with the HTTP door, hosting the
example `arithmetic` (the default) and `showcase`; one of them needs an API key."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.servers import ServeProcess, start_serve

ENVIRONMENTS = ("ors_grpc.examples.arithmetic:Arithmetic", "tests.playground.showcase_env:Showcase")
API_KEY = "playground-k3y"


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    with start_serve(*ENVIRONMENTS, "--http-port", "0") as process:
        yield process


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[ServeProcess]:
    with start_serve(*ENVIRONMENTS, "--http-port", "0", "--api-key", API_KEY) as process:
        yield process
