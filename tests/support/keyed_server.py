"""Fixtures of a server (`ors-grpc serve` with the HTTP door) that needs an API key."""

from __future__ import annotations

from typing import AsyncIterator, Iterator

import aiohttp
import pytest

from tests.support.servers import ServeProcess, start_serve

API_KEY = "k3y-for-tests"


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with start_serve("tests.support.environments:EchoEnv", "--http-port", "0", "--api-key", API_KEY) as process:
        yield process


@pytest.fixture
async def http(serve: ServeProcess) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=serve.http_url) as session:
        yield session
