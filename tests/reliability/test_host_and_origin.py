"""A web page cannot drive a local server: on every door a browser can reach
(the HTTP door of `serve --http-port` and of `bridge`, the playground, /docs,
/openapi.json, the MCP door), a `Host` that does not name loopback is 421
(DNS rebinding), a foreign `Origin` is 403 where state can change, and only
the origins allowed on purpose get CORS answers. The MCP door's half (it needs
the `mcp` extra): tests/mcp/test_host_and_origin.py. Clients that are not
browsers (no `Origin`) are unaffected. The rule's matching:
tests/bridge/test_browser_policy.py; in a real browser:
tests/playground/test_browser_origins.py."""

from __future__ import annotations

import json
from typing import Iterator

import aiohttp
import pytest
from openreward.api.environments.client import AsyncEnvironmentsAPI
from ors.client import ORS

from tests.support.bridge_http import read_sse
from tests.support.browser_requests import (
    ALLOWED_ORIGIN, ENVIRONMENT, FOREIGN_ORIGIN, OPENED, assert_foreign_origin, assert_misdirected, new_episode,
    port_of, request,
)
from tests.support.servers import ServeProcess, start_bridge, start_serve

pytestmark = pytest.mark.timeout(120)

@pytest.fixture(scope="module")
def plain() -> Iterator[ServeProcess]:
    """`serve` as the issue measured it: loopback, no key, nothing allowed."""
    with start_serve(ENVIRONMENT, "--http-port", "0") as serve:
        yield serve


@pytest.fixture(scope="module")
def opened_serve() -> Iterator[ServeProcess]:
    with start_serve(ENVIRONMENT, "--http-port", "0", *OPENED) as serve:
        yield serve


@pytest.fixture(scope="module")
def opened_bridge(plain: ServeProcess) -> Iterator[ServeProcess]:
    assert plain.grpc_target
    with start_bridge(plain.grpc_target, "--http-port", "0", *OPENED) as bridge:
        yield bridge


@pytest.fixture(params=["serve", "bridge"])
def opened(request: pytest.FixtureRequest) -> ServeProcess:
    """Both HTTP doors, started with the same --allowed-host/--allowed-origin."""
    return request.getfixturevalue(f"opened_{request.param}")


# ----------------------------------------------------------------------------
# DNS rebinding: the measurement, now refused
# ----------------------------------------------------------------------------


async def test_a_rebound_page_can_neither_create_episodes_nor_call_tools(plain: ServeProcess) -> None:
    url = plain.http_url
    sid = await new_episode(url)  # made by a client, not by the page
    rebound = {"Host": f"evil.example:{port_of(url)}", "Origin": f"http://evil.example:{port_of(url)}"}
    for path, body, extra in [
        ("/create_session", "", {"Content-Type": "text/plain"}),
        ("/create", {"env_name": "echoenv", "split": "train", "index": 0}, {"X-Session-ID": sid}),
        ("/echoenv/call", {"name": "echo", "input": {"text": "pwned"}}, {"X-Session-ID": sid}),
    ]:
        status, payload, _ = await request(url, "POST", path, body=body, **rebound, **extra)
        assert_misdirected(status, payload)
    status, payload, _ = await request(url, "GET", "/echoenv/messages", **{"X-Session-ID": sid})
    assert status == 200 and "pwned" not in json.dumps(payload)


@pytest.mark.parametrize("method, path", [
    ("GET", "/"), ("GET", "/playground/app.js"), ("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/health"),
    ("GET", "/list_environments"), ("POST", "/create_session"), ("POST", "/ping"), ("GET", "/no/such/route"),
])
async def test_every_http_route_refuses_a_foreign_host(plain: ServeProcess, method: str, path: str) -> None:
    status, payload, _ = await request(plain.http_url, method, path, Host=f"evil.example:{port_of(plain.http_url)}")
    assert_misdirected(status, payload)


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]:{port}", "127.0.0.1"])
async def test_loopback_names_with_any_port_are_served(plain: ServeProcess, host: str) -> None:
    status, payload, _ = await request(plain.http_url, "POST", "/create_session",
                                       Host=host.format(port=port_of(plain.http_url)))
    assert status == 200 and payload["sid"]


# ----------------------------------------------------------------------------
# --allowed-host
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("host, served", [
    ("proxy.example", True), ("Proxy.Example", True), ("proxy.example:8443", False),
    ("lb.example", True), ("lb.example:8443", True), ("lb.example:evil", False), ("other.example", False),
])
async def test_allowed_hosts_are_served(opened: ServeProcess, host: str, served: bool) -> None:
    status, payload, _ = await request(opened.http_url, "POST", "/create_session", Host=host)
    if not served:
        return assert_misdirected(status, payload)
    assert status == 200 and payload["sid"], payload


# ----------------------------------------------------------------------------
# Origin
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("origin", [FOREIGN_ORIGIN, "null", "http://127.0.0.1:1", "https://app.example.evil.example"])
async def test_a_foreign_origin_cannot_change_state_on_either_http_door(opened: ServeProcess, origin: str) -> None:
    url = opened.http_url
    sid = await new_episode(url)
    for path, body in [("/create_session", ""), ("/create", {"env_name": "echoenv", "split": "train", "index": 1}),
                       ("/echoenv/call", {"name": "echo", "input": {"text": "pwned"}}), ("/delete", "")]:
        status, payload, headers = await request(url, "POST", path, body=body, Origin=origin,
                                                 **{"Content-Type": "text/plain", "X-Session-ID": sid})
        assert_foreign_origin(status, payload, headers)
    # Reading is answered (a browser keeps the answer from the page: no CORS headers).
    status, payload, headers = await request(url, "GET", "/echoenv/messages", Origin=origin, **{"X-Session-ID": sid})
    assert status == 200 and "pwned" not in json.dumps(payload)
    assert "Access-Control-Allow-Origin" not in headers


async def test_the_servers_own_origin_is_served_without_cors_headers(opened: ServeProcess) -> None:
    url = opened.http_url
    for own in (url, url.replace("http://", "https://"), f"http://localhost:{port_of(url)}"):
        host = own.split("://", 1)[1]
        status, payload, headers = await request(url, "POST", "/create_session", Host=host, Origin=own)
        assert status == 200 and payload["sid"], payload
        assert "Access-Control-Allow-Origin" not in headers
    # The server's name on another port is another origin.
    status, payload, headers = await request(url, "POST", "/create_session", Origin=f"http://127.0.0.1:{int(port_of(url)) + 1}")
    assert_foreign_origin(status, payload, headers)


# ----------------------------------------------------------------------------
# CORS, for the allowed origins only
# ----------------------------------------------------------------------------


async def test_an_allowed_origin_gets_preflights_and_answers_with_cors_headers(opened: ServeProcess) -> None:
    url = opened.http_url
    status, _, headers = await request(url, "OPTIONS", "/echoenv/call", Origin=ALLOWED_ORIGIN, **{
        "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type,x-session-id,x-api-key"})
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == ALLOWED_ORIGIN and headers["Vary"] == "Origin"
    allowed_headers = {name.strip().lower() for name in headers["Access-Control-Allow-Headers"].split(",")}
    assert {"content-type", "x-session-id", "x-api-key", "authorization", "x-secrets"} <= allowed_headers
    assert "POST" in headers["Access-Control-Allow-Methods"]

    sid = await new_episode(url, Origin=ALLOWED_ORIGIN)
    async with aiohttp.ClientSession() as http:  # a streamed answer (SSE) carries them too
        async with http.post(url + "/echoenv/call", json={"name": "echo", "input": {"text": "hi"}},
                             headers={"Origin": ALLOWED_ORIGIN, "X-Session-ID": sid,
                                      "Accept": "text/event-stream"}) as response:
            assert response.status == 200
            assert response.headers["Access-Control-Allow-Origin"] == ALLOWED_ORIGIN
            assert "Retry-After" in response.headers["Access-Control-Expose-Headers"]
            assert "Origin" in response.headers["Vary"]
            assert (await read_sse(response)).result()["ok"]


async def test_a_preflight_of_a_foreign_origin_is_refused_and_nothing_is_a_wildcard(opened: ServeProcess) -> None:
    url, path = opened.http_url, "/echoenv/call"
    status, payload, headers = await request(url, "OPTIONS", path, Origin=FOREIGN_ORIGIN,
                                             **{"Access-Control-Request-Method": "POST"})
    assert_foreign_origin(status, payload, headers)
    status, _, headers = await request(url, "OPTIONS", path, Origin=ALLOWED_ORIGIN,
                                       **{"Access-Control-Request-Method": "POST"})
    assert status == 204 and headers["Access-Control-Allow-Origin"] == ALLOWED_ORIGIN
    assert all(value.strip() != "*" for name, value in headers.items() if name.lower().startswith("access-control"))


# ----------------------------------------------------------------------------
# The standard clients send no Origin: unaffected
# ----------------------------------------------------------------------------


def test_the_reference_client_runs_an_episode_through_both_doors(opened: ServeProcess) -> None:
    with ORS(base_url=opened.http_url) as client:
        with client.environment("echoenv").session(split="train", index=0) as session:
            assert session.call_tool("submit", {"answer": "hello"}).reward == 1.0


async def test_the_openreward_client_runs_an_episode_through_both_doors(opened: ServeProcess) -> None:
    api = AsyncEnvironmentsAPI(base_url=opened.http_url, api_key="")
    try:
        async with api.get("echoenv").session(split="train", index=0) as session:
            result = await session.call_tool("submit", {"answer": "hello"})
            assert (result.reward, result.finished) == (1.0, True)
    finally:
        await api.aclose()
