"""The MCP door follows the HTTP door's Host/Origin rule (one rule, one
home: ors_grpc/protocol/browser_policy.py), in both `serve --mcp-port` and
`bridge --mcp-port`: bound to loopback a foreign `Host` is 421 with a JSON
detail, a foreign `Origin` is 403 on every request (as the MCP spec asks),
and only allowed origins get CORS answers. The HTTP door's half:
tests/reliability/test_host_and_origin.py."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.browser_requests import (
    ALLOWED_ORIGIN, ENVIRONMENT, FOREIGN_ORIGIN, INITIALIZE, MCP_ACCEPT, OPENED, assert_foreign_origin,
    assert_misdirected, port_of, request,
)
from tests.support.servers import ServeProcess, start_bridge, start_serve

pytestmark = pytest.mark.timeout(120)

EPISODE = "/echoenv/mcp?split=train&index=0"


@pytest.fixture(scope="module")
def plain() -> Iterator[ServeProcess]:
    """`serve` as the issue measured it: loopback, no key, nothing allowed."""
    with start_serve(ENVIRONMENT, "--http-port", "0", "--mcp-port", "0") as serve:
        yield serve


@pytest.fixture(scope="module")
def opened_serve() -> Iterator[ServeProcess]:
    with start_serve(ENVIRONMENT, "--mcp-port", "0", *OPENED) as serve:
        yield serve


@pytest.fixture(scope="module")
def opened_bridge(plain: ServeProcess) -> Iterator[ServeProcess]:
    assert plain.grpc_target
    with start_bridge(plain.grpc_target, "--mcp-port", "0", *OPENED) as bridge:
        yield bridge


@pytest.fixture(params=["serve", "bridge"])
def opened(request: pytest.FixtureRequest) -> ServeProcess:
    """Both MCP doors, started with the same --allowed-host/--allowed-origin."""
    return request.getfixturevalue(f"opened_{request.param}")


async def end_mcp_session(url: str, session_id: str, **headers: str) -> None:
    status, _, _ = await request(url, "DELETE", EPISODE, **{"Mcp-Session-Id": session_id, **headers})
    assert status in (200, 204)


async def test_a_rebound_page_gets_421_with_a_json_detail(plain: ServeProcess) -> None:
    url = plain.mcp_url
    status, payload, _ = await request(url, "POST", EPISODE, body=INITIALIZE, Host=f"evil.example:{port_of(url)}",
                                       Origin=f"http://evil.example:{port_of(url)}", **MCP_ACCEPT)
    assert_misdirected(status, payload)


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]:{port}", "127.0.0.1"])
async def test_loopback_names_with_any_port_are_served(plain: ServeProcess, host: str) -> None:
    url = plain.mcp_url
    named = host.format(port=port_of(url))
    status, payload, headers = await request(url, "POST", EPISODE, body=INITIALIZE, Host=named, **MCP_ACCEPT)
    assert status == 200, payload
    await end_mcp_session(url, headers["Mcp-Session-Id"], Host=named)


@pytest.mark.parametrize("host, served", [
    ("proxy.example", True), ("Proxy.Example", True), ("proxy.example:8443", False),
    ("lb.example", True), ("lb.example:8443", True), ("lb.example:evil", False), ("other.example", False),
])
async def test_allowed_hosts_are_served(opened: ServeProcess, host: str, served: bool) -> None:
    status, payload, headers = await request(opened.mcp_url, "POST", EPISODE, body=INITIALIZE, Host=host,
                                             **MCP_ACCEPT)
    if not served:
        return assert_misdirected(status, payload)
    assert status == 200, payload
    await end_mcp_session(opened.mcp_url, headers["Mcp-Session-Id"], Host=host)


async def test_a_foreign_origin_is_refused_on_every_request(opened: ServeProcess) -> None:
    for method, body in (("POST", INITIALIZE), ("GET", None), ("DELETE", None)):
        status, payload, headers = await request(opened.mcp_url, method, EPISODE, body=body, Origin=FOREIGN_ORIGIN,
                                                 **MCP_ACCEPT)
        assert_foreign_origin(status, payload, headers)


async def test_a_preflight_is_answered_for_allowed_origins_only_and_never_with_a_wildcard(opened: ServeProcess) -> None:
    status, payload, headers = await request(opened.mcp_url, "OPTIONS", "/echoenv/mcp", Origin=FOREIGN_ORIGIN,
                                             **{"Access-Control-Request-Method": "POST"})
    assert_foreign_origin(status, payload, headers)
    status, _, headers = await request(opened.mcp_url, "OPTIONS", "/echoenv/mcp", Origin=ALLOWED_ORIGIN,
                                       **{"Access-Control-Request-Method": "POST"})
    assert status == 204 and headers["Access-Control-Allow-Origin"] == ALLOWED_ORIGIN
    assert "mcp-session-id" in headers["Access-Control-Allow-Headers"].lower()
    assert all(value.strip() != "*" for name, value in headers.items() if name.lower().startswith("access-control"))


async def test_an_allowed_origin_gets_cors_headers_on_its_answers(opened: ServeProcess) -> None:
    status, payload, headers = await request(opened.mcp_url, "POST", EPISODE, body=INITIALIZE, Origin=ALLOWED_ORIGIN,
                                             **MCP_ACCEPT)
    assert status == 200, payload
    assert headers["Access-Control-Allow-Origin"] == ALLOWED_ORIGIN
    assert "Mcp-Session-Id" in headers["Access-Control-Expose-Headers"]
    await end_mcp_session(opened.mcp_url, headers["Mcp-Session-Id"], Origin=ALLOWED_ORIGIN)
