"""The session table on its own: waiting for setup and deletion, without a network hop."""

from __future__ import annotations

import asyncio

import pytest

from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc.protocol.errors import ORSError
from ors_grpc._runtime.environment_host import EpisodeState
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
    session = await sessions.ready("sid")
    assert session.host.state is EpisodeState.READY
    env = session.host.env
    assert isinstance(env, EchoEnv) and env.task_spec == {"id": 5} and env.secret_names == ["K"]
    assert session.sid == "sid" and sessions.open_count == 1
    await sessions.close()
    assert sessions.open_count == 0
    assert session.host.state is EpisodeState.ENDED


class FailingSetupEnv(EchoEnv):
    teardowns = 0

    def setup(self) -> None:
        raise RuntimeError("no sandbox today")

    def teardown(self) -> None:
        FailingSetupEnv.teardowns += 1


async def test_a_failed_setup_is_answered_by_every_call_and_never_torn_down() -> None:
    sessions = table()
    session = await sessions.create("sid", FailingSetupEnv, {"id": 1}, {})  # the constructor went well
    with pytest.raises(ORSError) as caught:
        await sessions.ready("sid")
    assert caught.value.reason == errors_pb2.ERROR_REASON_SETUP_FAILED
    assert caught.value.message == "RuntimeError: no sandbox today"
    assert session.host.state is EpisodeState.SETUP_FAILED
    await sessions.delete("sid")
    assert session.host.state is EpisodeState.ENDED
    assert FailingSetupEnv.teardowns == 0


class SlowSyncSetupEnv(EchoEnv):
    """A sync setup, run in a user-code thread (which deletion cannot interrupt), that waits to be let go."""

    sync_code_on_loop = False
    teardowns = 0
    setup_started = None
    release = None

    def setup(self) -> None:
        SlowSyncSetupEnv.setup_started.set()
        SlowSyncSetupEnv.release.wait(10)

    def teardown(self) -> None:
        SlowSyncSetupEnv.teardowns += 1


async def test_an_episode_deleted_during_a_sync_setup_is_torn_down_once_after_it() -> None:
    import threading

    SlowSyncSetupEnv.setup_started, SlowSyncSetupEnv.release = threading.Event(), threading.Event()
    sessions = table()
    session = await sessions.create("sid", SlowSyncSetupEnv, {"id": 1}, {})
    await asyncio.get_running_loop().run_in_executor(None, SlowSyncSetupEnv.setup_started.wait, 10)
    assert session.host.state is EpisodeState.SETTING_UP and session.host.uninterruptible
    deleting = asyncio.create_task(sessions.delete("sid"))
    await asyncio.sleep(0.05)
    assert not deleting.done()  # deletion waits for the setup it cannot interrupt
    SlowSyncSetupEnv.release.set()
    await deleting
    assert session.host.state is EpisodeState.ENDED
    assert SlowSyncSetupEnv.teardowns == 1
