"""The open-session cap (`--max-sessions`) through both doors: past it, creating
is refused with a retry hint, and the sessions already open keep working.

The same cap at the service level: tests/service/test_sessions.py::test_max_sessions.
"""

from __future__ import annotations

import aiohttp
import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from tests.support.reliability_helpers import (
    grpc_call,
    grpc_episode,
    grpc_stub,
    http_call,
    http_episode,
    open_sessions,
    serve_probe,
)

pytestmark = pytest.mark.timeout(60)


async def test_past_the_session_cap_create_is_refused_and_open_sessions_keep_working() -> None:
    with serve_probe("--max-sessions", "3") as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http, grpc_stub(serve.grpc_target) as stub:
            http_sids = [await http_episode(http, f"http-{number}") for number in range(2)]
            grpc_sid = await grpc_episode(stub, "grpc-0")

            body = {"env_name": "probeenv", "task_spec": {"tag": "one-too-many"}}
            async with http.post("/create", json=body, headers={"X-Session-ID": "one-too-many"}) as response:
                assert response.status == 429
                assert response.headers["Retry-After"] == "1"
                assert await response.json() == {"detail": "Too many sessions"}
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await grpc_episode(stub, "one-too-many")
            assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "Too many sessions")
            assert dict(caught.value.trailing_metadata())["retry-after"] == "1"
            assert await open_sessions(stub) == 3

            # Nothing else degrades: discovery, pings and calls of every open session.
            async with http.get("/list_environments") as response:
                assert response.status == 200
            for sid in http_sids + [grpc_sid]:
                async with http.post("/ping", headers={"X-Session-ID": sid}) as response:
                    assert response.status == 200
                assert (await stub.Ping(pb.PingRequest(session_id=sid))).status == "ok"
                assert (await http_call(http, sid, "echo_tag")).result()["ok"] is True
                assert (await grpc_call(stub, sid, "echo_tag"))[-1].result.output.blocks

            # A freed slot can be taken again.
            async with http.post("/delete", headers={"X-Session-ID": http_sids[0]}) as response:
                assert response.status == 200
            await grpc_episode(stub, "after-a-delete")
            assert await open_sessions(stub) == 3
