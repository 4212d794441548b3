"""The orchestrator's side of an MCP episode, over gRPC: create the episode,
read its record, count the open sessions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, Iterator

import pytest
from mcp.shared.exceptions import MCPError

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from tests.support.mcp_environment import TASK
from tests.support.servers import ServeProcess

ENV = "mcpenv"
#: `ors-grpc serve` arguments: the MCP door and the HTTP door beside gRPC.
SERVE_ARGS = ("tests.support.mcp_environment:McpEnv", "--http-port", "0", "--mcp-port", "0")
#: How long the episodes of ended MCP sessions may take to be deleted.
CLEANUP_WAIT_S = 10.0


def episode_url(server: ServeProcess, session_id: str) -> str:
    return f"{server.mcp_url}/{ENV}/mcp/{session_id}"


async def create_episode(stub: pb_grpc.EnvironmentServiceStub, task: Any = TASK, **metadata: str) -> str:
    """The orchestrator's episode: a session id and an episode of `task`, over gRPC."""
    md = tuple(metadata.items())
    sid = (await stub.CreateSessionId(pb.CreateSessionIdRequest(), metadata=md)).session_id
    request = pb.CreateEpisodeRequest(session_id=sid, env_name=ENV)
    request.task_spec.json = json.dumps(task)
    await stub.CreateEpisode(request, metadata=md)
    return sid


async def record(stub: pb_grpc.EnvironmentServiceStub, sid: str) -> pb.EpisodeRecord:
    return (await stub.GetEpisodeRecord(pb.GetEpisodeRecordRequest(session_id=sid))).record


async def open_sessions(stub: pb_grpc.EnvironmentServiceStub) -> int:
    return (await stub.Health(pb.HealthRequest())).open_sessions


async def wait_for_open_sessions(stub: pb_grpc.EnvironmentServiceStub, count: int) -> int:
    """The open session count once it is `count`, or as it is after CLEANUP_WAIT_S."""
    deadline = time.monotonic() + CLEANUP_WAIT_S
    while (now := await open_sessions(stub)) != count and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return now


@contextlib.contextmanager
def mcp_refusal() -> Iterator[list[MCPError]]:
    """Expects the block to fail with an MCPError, which the client may wrap in exception
    groups (an error while it connects); the list then holds that error."""
    caught: list[MCPError] = []
    try:
        yield caught
    except BaseException as exc:  # noqa: B036 (groups are BaseExceptionGroup when they hold cancellation)
        error = _mcp_error_in(exc)
        if error is None:
            raise
        caught.append(error)
    else:
        pytest.fail("the MCP client raised no MCPError")


def _mcp_error_in(exc: BaseException) -> MCPError | None:
    if isinstance(exc, MCPError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _mcp_error_in(inner)
        if found is not None:
            return found
    return None
