"""The session table on its own: waiting for setup and deletion, without a network hop."""

from __future__ import annotations

import asyncio

import pytest

from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc.protocol.errors import ORSError
from ors_grpc._runtime.sessions import SessionTable
from tests.support.environments import EchoEnv


class NeverReadyEnv(EchoEnv):
    async def setup(self) -> None:
        await asyncio.Event().wait()


def table() -> SessionTable:
    return SessionTable(session_timeout_s=900, reaper_interval_s=5, result_linger_s=60)


async def test_waiter_gets_session_deleted_when_deleted_during_setup() -> None:
    sessions = table()
    await sessions.create("sid", NeverReadyEnv, {"id": 0}, {})
    waiter = asyncio.create_task(sessions.ready("sid"))
    await asyncio.sleep(0)  # let the waiter reach its wait for setup
    await sessions.delete("sid")
    with pytest.raises(ORSError) as caught:
        await waiter
    assert caught.value.reason == errors_pb2.ERROR_REASON_SESSION_DELETED
    assert caught.value.message == "Session deleted"
    with pytest.raises(ORSError) as caught:
        await sessions.ready("sid")
    assert caught.value.reason == errors_pb2.ERROR_REASON_SESSION_NOT_FOUND


async def test_ready_returns_the_set_up_environment() -> None:
    sessions = table()
    await sessions.create("sid", EchoEnv, {"id": 5}, {"K": "v"})
    session, env = await sessions.ready("sid")
    assert isinstance(env, EchoEnv) and env.task_spec == {"id": 5} and env.secret_names == ["K"]
    assert session.sid == "sid" and sessions.open_count == 1
    await sessions.close()
    assert sessions.open_count == 0
