"""`ors-grpc bridge` alone in front of a `serve` backend that goes away and comes back."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.support.bridge_http import call, create_episode, parse_sse
from tests.support.servers import start_bridge, start_serve

ENVIRONMENT = "tests.support.environments:EchoEnv"
RECOVERY_ATTEMPTS = 100  # x 0.1 s: the channel's reconnect backoff is capped at 1 s


async def wait_until_served(http: aiohttp.ClientSession, path: str) -> int:
    """Poll `path` until it is not a 503 (bounded); its final status."""
    for _ in range(RECOVERY_ATTEMPTS):
        async with http.get(path) as response:
            if response.status != 503:
                return response.status
        await asyncio.sleep(0.1)
    return 503


async def test_backend_down_is_503_with_retry_after_and_the_bridge_recovers() -> None:
    with start_serve(ENVIRONMENT) as backend:
        backend_port = backend.grpc_target.rsplit(":", 1)[1]
        with start_bridge(backend.grpc_target) as bridge:
            async with aiohttp.ClientSession(base_url=bridge.http_url) as http:
                sid = await create_episode(http, {"split": "train", "index": 0})
                assert (await call(http, sid, "echo", {"text": "up"})).result()["ok"] is True

                backend.stop()
                for path in ("/list_environments", "/echoenv/splits", "/health"):
                    async with http.get(path) as response:
                        assert response.status == 503, path
                        assert response.headers["Retry-After"] == "1"
                        detail = (await response.json())["detail"]
                        assert "unavailable" in detail and backend_port not in detail
                async with http.post("/echoenv/call", json={"name": "echo", "input": {}}, headers={"X-Session-ID": sid}) as response:
                    assert response.status == 503

                with start_serve(ENVIRONMENT, "--port", backend_port):
                    assert await wait_until_served(http, "/list_environments") == 200
                    # A new backend: the old session is gone, new ones work.
                    async with http.get("/echoenv/prompt", headers={"X-Session-ID": sid}) as response:
                        assert response.status == 404
                    sid = await create_episode(http, {"split": "train", "index": 1})
                    assert (await call(http, sid, "echo", {"text": "back"})).result()["ok"] is True


async def test_a_call_in_flight_when_the_backend_dies_ends_without_a_result() -> None:
    with start_serve(ENVIRONMENT) as backend, start_bridge(backend.grpc_target) as bridge:
        async with aiohttp.ClientSession(base_url=bridge.http_url) as http:
            sid = await create_episode(http, {"split": "train", "index": 0})
            body = {"name": "sleep", "input": {"seconds": 30}}
            async with http.post("/echoenv/call", json=body, headers={"X-Session-ID": sid}) as response:
                assert await response.content.readline() == b"event: task_id\n"
                backend.proc.kill()  # a crash, not a graceful stop
                rest = parse_sse((await response.content.read()).decode())
            # No `end` and no `error`: the clients treat that as a dropped
            # stream and retry with the task id, rather than giving up.
            assert [name for name in rest.names() if name in ("end", "error")] == []
