"""Session ids that name the backend that issued them (`serve --advertise-host`), and the ids a
server remembers issuing: what Envoy's stateful sessions need (docs/deployment.md,
"Episodes through deploys and scaling"; behind Envoy: tests/deploy/test_rolling_restart.py).

Behind Envoy, a request's `x-session-id` reaches the backend as the id's KEY (Envoy's envelope
strips the address) while the request message may carry the whole id: the server takes both as
the session KEY. These tests send what Envoy would pass on.
"""

from __future__ import annotations

import base64

import aiohttp
import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc._runtime.issued_ids import IssuedIds
from ors_grpc.protocol.constants import SESSION_ID_METADATA_KEY
from ors_grpc.protocol.routed_ids import door_address, routed_id, session_key
from ors_grpc.server import ServerConfig, create_server
from tests.support.environments import EchoEnv
from tests.support.grpc_calls import call_tool
from tests.support.servers import start_serve


def test_a_routed_id_is_envoys_envelope_of_the_address_and_the_key() -> None:
    sid = routed_id("10.1.2.3:50051", "0b6c6a3e-key")
    address, _, value = sid.partition(";UV:")
    assert base64.b64decode(address) == b"10.1.2.3:50051"
    assert base64.b64decode(value) == b"0b6c6a3e-key"
    assert session_key(sid) == "0b6c6a3e-key"


@pytest.mark.parametrize("sid", ["6f0e3c1a-plain-uuid", "x;UV:not base64!", ";UV:a2V5", "YQ==;UV:"])
def test_any_other_id_is_its_own_key(sid: str) -> None:
    assert session_key(sid) == sid


def test_an_ipv6_door_is_written_as_envoy_writes_it() -> None:
    assert door_address("fd00::7", 8080) == "[fd00::7]:8080"
    assert door_address("10.0.0.7", 8080) == "10.0.0.7:8080"


def test_issued_ids_are_remembered_until_used_or_too_old() -> None:
    issued = IssuedIds()
    first, second = issued.new(), issued.new()
    assert first != second and issued.recent(first) and issued.recent(second)
    assert not issued.recent("never-issued")
    issued.forget(first)
    assert not issued.recent(first) and issued.recent(second)
    expired = IssuedIds(ttl_s=-1.0)  # every id is already too old
    old = expired.new()
    assert not expired.recent(old)
    expired.new()
    assert len(expired) == 1  # the old one is forgotten as the next is issued


async def test_ids_name_the_grpc_door_and_a_session_is_its_key_in_the_message_and_the_metadata() -> None:
    server, port = await create_server([EchoEnv], "127.0.0.1:0", config=ServerConfig(advertise_host="127.0.0.1"))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            sid = (await stub.CreateSessionId(pb.CreateSessionIdRequest())).session_id
            assert base64.b64decode(sid.partition(";UV:")[0]).decode() == f"127.0.0.1:{port}"
            key = session_key(sid)
            # What Envoy passes on: the whole id in the message, its KEY in the metadata.
            behind_envoy = ((SESSION_ID_METADATA_KEY, key),)
            created = await stub.CreateEpisode(pb.CreateEpisodeRequest(
                session_id=sid, env_name="echoenv", task_index=pb.TaskIndex(split="train", index=0)),
                metadata=behind_envoy)
            assert created.session_id == key
            _, result = await call_tool(stub, sid, "echo", {"text": "by the whole id"})
            assert result.result.output.blocks[0].text.text == "by the whole id"
            prompt = await stub.GetPrompt(pb.GetPromptRequest(session_id=key), metadata=((SESSION_ID_METADATA_KEY, sid),))
            assert prompt.blocks
            await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid), metadata=behind_envoy)
            assert server.sessions.open_count == 0
    finally:
        await server.stop(None)


async def test_a_run_episode_stream_answers_its_route_key_for_a_proxy_to_name_its_backend_in() -> None:
    server, port = await create_server([EchoEnv], "127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = pb_grpc.EnvironmentServiceStub(channel).RunEpisode(metadata=((SESSION_ID_METADATA_KEY, "route-1"),))
            await stream.write(pb.RunEpisodeRequest(create=pb.CreateEpisodeRequest(
                session_id="episode-1", env_name="echoenv", task_index=pb.TaskIndex(split="train", index=0))))
            assert (await stream.read()).create.session_id == "episode-1"
            assert dict(await stream.initial_metadata())[SESSION_ID_METADATA_KEY] == "route-1"
            stream.cancel()
    finally:
        await server.stop(None)


async def test_the_http_door_names_itself_in_the_ids_it_hands_out() -> None:
    with start_serve("tests.support.environments:EchoEnv", "--http-port", "0", "--advertise-host", "127.0.0.1") as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http:
            async with http.post("/create_session") as response:
                sid = (await response.json())["sid"]
            assert base64.b64decode(sid.partition(";UV:")[0]).decode() == serve.http_url.removeprefix("http://")
            # Envoy passes the KEY on in X-Session-ID; a direct client sends the whole id: both are the session.
            async with http.post("/create", json={"split": "train", "index": 0},
                                 headers={"X-Session-ID": session_key(sid)}) as response:
                assert response.status == 200, await response.text()
            async with http.post("/delete", headers={"X-Session-ID": sid}) as response:
                assert response.status == 200
            async with http.get("/echoenv/prompt", headers={"X-Session-ID": session_key(sid)}) as response:
                assert response.status in (404, 410)  # deleted under either spelling
