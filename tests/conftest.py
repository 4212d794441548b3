"""Shared fixtures: an in-process ORS gRPC server on loopback and a stub onto it."""

from __future__ import annotations

from typing import AsyncIterator

import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.server import ServerConfig, create_server
from tests.environments import EchoEnv, FailingSetupEnv, SlowSetupEnv

TEST_ENVIRONMENTS = [EchoEnv, SlowSetupEnv, FailingSetupEnv]


@pytest.fixture
def server_config() -> ServerConfig:
    """Override in a test module (or parametrize) to configure the server."""
    return ServerConfig()


@pytest.fixture
async def grpc_server(server_config: ServerConfig) -> AsyncIterator[str]:
    """A started server hosting the test environments; yields its target."""
    server, port = await create_server(TEST_ENVIRONMENTS, "127.0.0.1:0", config=server_config)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


@pytest.fixture
async def channel(grpc_server: str) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(grpc_server) as channel:
        yield channel


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> pb_grpc.EnvironmentServiceStub:
    return pb_grpc.EnvironmentServiceStub(channel)
