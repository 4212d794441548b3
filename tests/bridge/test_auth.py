"""The bridge forwards the API key to the gRPC service; limits come back as HTTP statuses."""

from __future__ import annotations


import aiohttp
import pytest
from ors.client import ORS
from ors.client._types import AuthenticationError

from tests.support.bridge_http import create_episode, new_session_id
from tests.support.keyed_server import API_KEY, http, serve  # noqa: F401 (fixtures: a server with an API key)
from tests.support.servers import ServeProcess, start_serve

async def test_health_needs_no_key(http: aiohttp.ClientSession) -> None:
    async with http.get("/health") as response:
        assert (response.status, await response.json()) == (200, {"status": "ok"})


@pytest.mark.parametrize("path", ["/list_environments", "/echoenv/tools", "/tools", "/version"])
async def test_routes_refuse_a_missing_or_wrong_key(http: aiohttp.ClientSession, path: str) -> None:
    for headers in ({}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer wrong"}):
        async with http.get(path, headers=headers, allow_redirects=False) as response:
            assert response.status == 401
            detail = (await response.json())["detail"]
            assert "wrong" not in detail and API_KEY not in detail


@pytest.mark.parametrize("headers", [{"X-API-Key": API_KEY}, {"Authorization": f"Bearer {API_KEY}"}])
async def test_the_key_is_forwarded_from_either_header(http: aiohttp.ClientSession, headers: dict) -> None:
    async with http.get("/list_environments", headers=headers) as response:
        assert (response.status, await response.json()) == (200, ["echoenv"])
    async with http.post("/create_session", headers=headers) as response:
        sid = (await response.json())["sid"]
    async with http.post("/create", json={"split": "train", "index": 0}, headers={**headers, "X-Session-ID": sid}) as response:
        assert response.status == 200
    async with http.post("/echoenv/call", json={"name": "echo", "input": {"text": "k"}}, headers={**headers, "X-Session-ID": sid}) as response:
        assert response.status == 200
    async with http.post("/echoenv/call", json={"name": "echo", "input": {"text": "k"}}, headers={"X-Session-ID": sid}) as response:
        assert response.status == 401


def test_the_reference_client_with_and_without_the_key(serve: ServeProcess) -> None:
    with ORS(base_url=serve.http_url, api_key=API_KEY) as client:
        with client.environment("echoenv").session(split="test", index=0) as session:
            assert session.call_tool("submit", {"answer": "yes"}).reward == 1.0
    with ORS(base_url=serve.http_url, api_key="wrong") as client:
        with pytest.raises(AuthenticationError):
            client.environment("echoenv").list_splits()


async def test_too_many_sessions_is_429_with_retry_after() -> None:
    with start_serve("tests.support.environments:EchoEnv", "--http-port", "0", "--max-sessions", "1") as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http:
            await create_episode(http, {"split": "train", "index": 0})
            sid = await new_session_id(http)
            async with http.post("/create", json={"split": "train", "index": 1}, headers={"X-Session-ID": sid}) as response:
                assert response.status == 429
                assert response.headers["Retry-After"] == "1"
                assert "detail" in await response.json()
