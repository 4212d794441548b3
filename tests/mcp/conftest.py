"""A real `ors-grpc serve` with the MCP door (and the HTTP door) on loopback,
shared by a module's tests, and a gRPC stub onto it."""

from __future__ import annotations

from typing import AsyncIterator, Iterator

import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from tests.support.mcp_door import SERVE_ARGS
from tests.support.servers import ServeProcess, start_serve


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    with start_serve(*SERVE_ARGS) as serve:
        yield serve


@pytest.fixture
async def stub(server: ServeProcess) -> AsyncIterator[pb_grpc.EnvironmentServiceStub]:
    async with grpc.aio.insecure_channel(server.grpc_target) as channel:
        yield pb_grpc.EnvironmentServiceStub(channel)


