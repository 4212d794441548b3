"""What the Host/Origin tests of every door share: the servers' options, one
raw request with exactly the given headers, and the refusals' shapes."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

__all__ = [
    "ALLOWED_HOSTS", "ALLOWED_ORIGIN", "ENVIRONMENT", "FOREIGN_ORIGIN", "INITIALIZE", "MCP_ACCEPT", "OPENED",
    "assert_foreign_origin", "assert_misdirected", "new_episode", "port_of", "request",
]

ENVIRONMENT = "tests.support.environments:EchoEnv"
ALLOWED_HOSTS = ("proxy.example", "lb.example:*")
ALLOWED_ORIGIN = "https://app.example"
OPENED = ("--allowed-host", ALLOWED_HOSTS[0], "--allowed-host", ALLOWED_HOSTS[1],
          "--allowed-origin", ALLOWED_ORIGIN)
FOREIGN_ORIGIN = "http://evil.example"
MCP_ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}


def port_of(url: str) -> str:
    return url.rsplit(":", 1)[1]


async def request(url: str, method: str, path: str, *, body: Any = None, **headers: str) -> tuple[int, Any, Any]:
    """One request with exactly these headers (and `Host` as given); status, JSON or text, headers."""
    data = body if isinstance(body, (str, bytes)) or body is None else json.dumps(body)
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url + path, data=data, headers=headers, allow_redirects=False) as response:
            text = await response.text()
            try:
                payload = json.loads(text)
            except ValueError:
                payload = text
            return response.status, payload, response.headers


async def new_episode(url: str, **headers: str) -> str:
    status, payload, _ = await request(url, "POST", "/create_session", **headers)
    assert status == 200, payload
    sid = payload["sid"]
    status, payload, _ = await request(url, "POST", "/create", body={"env_name": "echoenv", "split": "train", "index": 0},
                                       **{"X-Session-ID": sid, "Content-Type": "application/json", **headers})
    assert status == 200, payload
    return sid


def assert_misdirected(status: int, payload: Any) -> None:
    assert status == 421
    assert "DNS rebinding" in payload["detail"] and "--allowed-host" in payload["detail"]


def assert_foreign_origin(status: int, payload: Any, headers: Any) -> None:
    assert status == 403
    assert "--allowed-origin" in payload["detail"]
    assert "Access-Control-Allow-Origin" not in headers
