"""Sessions and episodes: background setup, waiting, errors, deletion, reaping, limits."""

from __future__ import annotations

import asyncio
import logging
import threading

import grpc
import pytest

from ors_grpc import TextBlock
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.server import ServerConfig, create_server
from tests.support.grpc_calls import call_tool, create_episode, error_reason, expect_error, serving
from tests.support.environments import EchoEnv, FailingSetupEnv

# Bounds waits on events so a broken server fails the test instead of hanging it.
WAIT_S = 10.0


class GatedSetupEnv(EchoEnv):
    """Setup waits for the test to open `gate`; prompt tells whether setup ran."""

    setup_started: asyncio.Event
    gate: asyncio.Event

    @classmethod
    def reset(cls) -> None:
        cls.setup_started, cls.gate = asyncio.Event(), asyncio.Event()

    async def setup(self) -> None:
        self.setup_done = False
        type(self).setup_started.set()
        await type(self).gate.wait()
        self.setup_done = True

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"setup done: {self.setup_done}")]


class TeardownEnv(EchoEnv):
    """Records each teardown (by task id) and signals it."""

    torn_down: list[int] = []
    teardown_event: asyncio.Event

    @classmethod
    def reset(cls) -> None:
        cls.torn_down, cls.teardown_event = [], asyncio.Event()

    async def teardown(self) -> None:
        type(self).torn_down.append(self.task_spec["id"])
        type(self).teardown_event.set()


class SyncBlockingSetupEnv(EchoEnv):
    """A synchronous setup that blocks its thread until the test releases it."""

    started = threading.Event()
    release = threading.Event()

    torn_down: list[int] = []

    def setup(self) -> None:
        type(self).started.set()
        type(self).release.wait(WAIT_S)

    def teardown(self) -> None:
        type(self).torn_down.append(self.task_spec["id"])


class LeakySetupEnv(EchoEnv):
    """Setup fails with a message containing a secret value."""

    def setup(self) -> None:
        raise RuntimeError(f"bad token {self.secret_value}")

    def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        self.secret_value = secrets.get("TOKEN", "")


class BrokenPromptEnv(EchoEnv):
    def get_prompt(self) -> list[TextBlock]:
        raise KeyError("no prompt")


ENVS = [EchoEnv, GatedSetupEnv, TeardownEnv, SyncBlockingSetupEnv, LeakySetupEnv, FailingSetupEnv, BrokenPromptEnv]


@pytest.fixture
async def stub():
    GatedSetupEnv.reset()
    TeardownEnv.reset()
    async with serving(ENVS) as stub:
        yield stub


async def open_sessions(stub) -> int:
    return (await stub.Health(pb.HealthRequest())).open_sessions


async def test_create_answers_before_setup_and_prompt_waits_for_it(stub) -> None:
    sid = await create_episode(stub, "gatedsetupenv")
    await asyncio.wait_for(GatedSetupEnv.setup_started.wait(), WAIT_S)
    assert await open_sessions(stub) == 1
    prompt = asyncio.ensure_future(stub.GetPrompt(pb.GetPromptRequest(session_id=sid)))
    tools = asyncio.ensure_future(stub.ListTaskTools(pb.ListTaskToolsRequest(session_id=sid)))
    assert (await stub.Ping(pb.PingRequest(session_id=sid))).status == "ok"  # pings don't wait
    GatedSetupEnv.gate.set()
    assert (await prompt).blocks[0].text.text == "setup done: True"
    assert [t.name for t in (await tools).tools][-1] == "hint"


async def test_setup_failure_is_reported_to_every_session_call(stub) -> None:
    sid = await create_episode(stub, "failingsetupenv")
    for call in [
        stub.GetPrompt(pb.GetPromptRequest(session_id=sid)),
        stub.ListTaskTools(pb.ListTaskToolsRequest(session_id=sid)),
        stub.CallTool(pb.CallToolRequest(session_id=sid, call={"name": "echo"})),
    ]:
        error = await expect_error(call)
        assert (error.code(), error.details()) == (grpc.StatusCode.FAILED_PRECONDITION, "RuntimeError: setup exploded")
        assert error_reason(error) == "ERROR_REASON_SETUP_FAILED"
    assert (await stub.Ping(pb.PingRequest(session_id=sid))).status == "ok"


async def test_delete_while_waiting_for_setup(stub) -> None:
    sid = await create_episode(stub, "gatedsetupenv")
    await asyncio.wait_for(GatedSetupEnv.setup_started.wait(), WAIT_S)
    prompt = asyncio.ensure_future(stub.GetPrompt(pb.GetPromptRequest(session_id=sid)))
    # A call sent after the prompt on the same channel: once it is answered,
    # the server has taken the prompt call too (see test_service_session_table for
    # the same case without a network in between).
    await stub.Ping(pb.PingRequest(session_id=sid))
    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
    error = await expect_error(prompt)
    assert (error.code(), error.details()) == (grpc.StatusCode.ABORTED, "Session deleted")
    assert error_reason(error) == "ERROR_REASON_SESSION_DELETED"
    assert await open_sessions(stub) == 0


async def test_unknown_session_is_not_found(stub) -> None:
    for call in [
        stub.GetPrompt(pb.GetPromptRequest(session_id="nope")),
        stub.ListTaskTools(pb.ListTaskToolsRequest(session_id="nope")),
        stub.CallTool(pb.CallToolRequest(session_id="nope", call={"name": "echo"})),
        stub.Ping(pb.PingRequest(session_id="nope")),
    ]:
        error = await expect_error(call)
        assert (error.code(), error.details()) == (
            grpc.StatusCode.NOT_FOUND, "Active environment not found: no open episode has session id 'nope'")
        assert error_reason(error) == "ERROR_REASON_SESSION_NOT_FOUND"


async def test_delete_is_idempotent_and_tears_down_once(stub) -> None:
    sid = await create_episode(stub, "teardownenv", task_spec={"id": 7})
    await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))  # set up
    for _ in range(2):
        assert (await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))).session_id == sid
    assert TeardownEnv.torn_down == [7]
    assert (await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id="never-created"))).session_id
    error = await expect_error(stub.Ping(pb.PingRequest(session_id=sid)))
    assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_delete_session_id_ends_its_episode(stub) -> None:
    sid = await create_episode(stub, "teardownenv", task_spec={"id": 8})
    await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
    assert (await stub.DeleteSessionId(pb.DeleteSessionIdRequest(session_id=sid))).session_id == sid
    assert TeardownEnv.torn_down == [8]
    assert (await stub.DeleteSessionId(pb.DeleteSessionIdRequest(session_id=sid))).session_id == sid
    assert await open_sessions(stub) == 0


async def test_create_episode_errors(stub) -> None:
    sid = await create_episode(stub)

    async def create_error(**fields) -> grpc.aio.AioRpcError:
        task_spec = fields.pop("task_spec_json", None)
        request = pb.CreateEpisodeRequest(**fields)
        if task_spec is not None:
            request.task_spec.json = task_spec
        return await expect_error(stub.CreateEpisode(request))

    index = pb.TaskIndex(split="train", index=0)
    cases = [
        (dict(session_id=sid, task_index=index), "ERROR_REASON_SESSION_EXISTS", "Session already exists"),
        (dict(session_id="s", env_name="nope", task_index=index),
         "ERROR_REASON_UNKNOWN_ENVIRONMENT", "unknown environment 'nope'; this server hosts: " + ", ".join(
             env.__name__.lower() for env in ENVS)),
        (dict(session_id="s", task_index=pb.TaskIndex(split="x")), "ERROR_REASON_INVALID_SPLIT",
         "Invalid split: 'x' is not a split of echoenv (its splits: train, test)"),
        (dict(session_id="s", task_index=pb.TaskIndex(split="train", index=9)), "ERROR_REASON_INVALID_INDEX",
         "Invalid index: 9 is out of range for split 'train', which has 3 tasks (0 to 2, or -3 to -1 from the end)"),
        (dict(session_id="s"), "ERROR_REASON_INVALID_REQUEST", None),
        (dict(session_id="s", task_spec_json="{not json"), "ERROR_REASON_INVALID_REQUEST", None),
        (dict(session_id="s", task_spec_json="[1, 2]"), "ERROR_REASON_INVALID_REQUEST", None),
        (dict(task_index=index), "ERROR_REASON_INVALID_REQUEST", None),
    ]
    for fields, reason, message in cases:
        error = await create_error(**fields)
        assert error_reason(error) == reason, fields
        if message is not None:
            assert error.details() == message
    assert await open_sessions(stub) == 1


async def test_default_environment_and_session_id_from_metadata(stub) -> None:
    metadata = (("x-session-id", "from-metadata"),)
    request = pb.CreateEpisodeRequest(task_index=pb.TaskIndex(split="test", index=1))
    assert (await stub.CreateEpisode(request, metadata=metadata)).session_id == "from-metadata"
    prompt = await stub.GetPrompt(pb.GetPromptRequest(), metadata=metadata)
    assert prompt.blocks[0].text.text == "Say no"  # EchoEnv, the first environment
    assert (await stub.Ping(pb.PingRequest(), metadata=metadata)).status == "ok"
    _, event = await call_tool(stub, "from-metadata", "echo", {"text": "x"})
    assert event.result.output.blocks[0].text.text == "x"


async def test_secrets_reach_the_environment_but_not_the_logs(stub, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    secrets = {"TOKEN": "s3cr3t-value", "OTHER": "another-s3cr3t"}
    sid = await create_episode(stub, secrets=secrets)
    _, event = await call_tool(stub, sid, "secret")
    assert event.result.output.blocks[0].text.text == "secret:['OTHER', 'TOKEN']"
    leaky = await create_episode(stub, "leakysetupenv", secrets=secrets)
    error = await expect_error(stub.GetPrompt(pb.GetPromptRequest(session_id=leaky)))
    assert error_reason(error) == "ERROR_REASON_SETUP_FAILED"
    assert "setup_failed" in caplog.text
    assert "s3cr3t" not in caplog.text


async def test_unexpected_error_in_user_code_is_internal(stub) -> None:
    sid = await create_episode(stub, "brokenpromptenv")
    error = await expect_error(stub.GetPrompt(pb.GetPromptRequest(session_id=sid)))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "KeyError" in error.details()
    assert (await stub.Ping(pb.PingRequest(session_id=sid))).status == "ok"


async def test_sync_setup_does_not_block_other_sessions(stub) -> None:
    SyncBlockingSetupEnv.started.clear()
    SyncBlockingSetupEnv.release.clear()
    other = await create_episode(stub)
    blocked = await create_episode(stub, "syncblockingsetupenv")
    prompt = asyncio.ensure_future(stub.GetPrompt(pb.GetPromptRequest(session_id=blocked)))
    await asyncio.get_running_loop().run_in_executor(None, SyncBlockingSetupEnv.started.wait, WAIT_S)
    # The setup thread is blocked now; the loop must still serve the other session.
    assert (await stub.Ping(pb.PingRequest(session_id=other))).status == "ok"
    _, event = await call_tool(stub, other, "echo", {"text": "still serving"})
    assert event.result.output.blocks[0].text.text == "still serving"
    assert not prompt.done()
    SyncBlockingSetupEnv.release.set()
    assert (await prompt).blocks[0].text.text == "Say hello"


async def test_max_sessions() -> None:
    async with serving([EchoEnv], ServerConfig(max_sessions=1)) as stub:
        sid = await create_episode(stub)
        call = stub.CreateEpisode(pb.CreateEpisodeRequest(
            session_id="second", task_index=pb.TaskIndex(split="train", index=0)))
        error = await expect_error(call)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_reason(error) == "ERROR_REASON_TOO_MANY_SESSIONS"
        assert dict(error.trailing_metadata())["retry-after"] == "1"
        await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
        await create_episode(stub)


# Short enough to see reaping, long enough for a client's next call to
# arrive first even on a loaded machine.
REAPING = ServerConfig(session_timeout_s=0.5, reaper_interval_s=0.05)


async def test_reaper_tears_down_idle_sessions() -> None:
    TeardownEnv.reset()
    async with serving([TeardownEnv], REAPING) as stub:
        sid = await create_episode(stub, "teardownenv", task_spec={"id": 1})
        # No further call: setup (instant) completes in the background, then
        # the idle session is reaped.
        await asyncio.wait_for(TeardownEnv.teardown_event.wait(), WAIT_S)
        assert TeardownEnv.torn_down == [1]
        error = await expect_error(stub.Ping(pb.PingRequest(session_id=sid)))
        assert error_reason(error) == "ERROR_REASON_SESSION_NOT_FOUND"


async def test_session_with_call_in_flight_is_not_reaped() -> None:
    TeardownEnv.reset()
    async with serving([TeardownEnv], REAPING) as stub:
        sid = await create_episode(stub, "teardownenv", task_spec={"id": 2})
        # The call outlives several timeouts; nothing else keeps the session
        # active. Reaping would have cancelled it (SESSION_DELETED).
        _, event = await call_tool(stub, sid, "sleep", {"seconds": 2.0})
        assert event.result.output.blocks[0].text.text == "slept"
        await asyncio.wait_for(TeardownEnv.teardown_event.wait(), WAIT_S)  # idle now: reaped
        assert TeardownEnv.torn_down == [2]


async def test_stopping_the_server_tears_down_every_session() -> None:
    TeardownEnv.reset()
    server, port = await create_server([TeardownEnv], "127.0.0.1:0")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        for task_id in (1, 2):
            sid = await create_episode(stub, "teardownenv", task_spec={"id": task_id})
            await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
    await server.stop(None)
    assert sorted(TeardownEnv.torn_down) == [1, 2]



async def test_delete_during_sync_setup_waits_for_it_then_tears_down(stub) -> None:
    SyncBlockingSetupEnv.started.clear()
    SyncBlockingSetupEnv.release.clear()
    SyncBlockingSetupEnv.torn_down = []
    other = await create_episode(stub)
    sid = await create_episode(stub, "syncblockingsetupenv", index=1)
    await asyncio.get_running_loop().run_in_executor(None, SyncBlockingSetupEnv.started.wait, WAIT_S)
    delete = asyncio.ensure_future(stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid)))
    assert (await stub.Ping(pb.PingRequest(session_id=other))).status == "ok"  # the loop is free
    assert not delete.done()  # the sync setup cannot be interrupted: delete waits for it
    SyncBlockingSetupEnv.release.set()
    await delete
    assert SyncBlockingSetupEnv.torn_down == [1]
