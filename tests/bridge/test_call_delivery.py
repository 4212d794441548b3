"""How `/call` delivers a result: in one response when it comes within
`QUICK_RESULT_S` of the task id, streamed otherwise. Either way the client
reads the same events."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator, Mapping

import aiohttp
import pytest

from http_bridge import app as bridge_app
from ors_grpc.server import create_server, in_process_channel
from tests.support.bridge_http import create_episode, parse_sse
from tests.support.grpc_calls import TEST_ENVIRONMENTS


@contextlib.asynccontextmanager
async def bridge() -> AsyncIterator[aiohttp.ClientSession]:
    """A server and a bridge onto it through the in-process channel, as `serve --http-port` runs them."""
    server, _ = await create_server(TEST_ENVIRONMENTS, "127.0.0.1:0")
    runner, port = await bridge_app.start_bridge("in-process", "127.0.0.1", 0, channel=in_process_channel(server))
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            yield http
    finally:
        await runner.cleanup()
        await server.stop(None)


async def sleep_call(http: aiohttp.ClientSession) -> tuple[Mapping[str, str], list[tuple[str, str]]]:
    sid = await create_episode(http, {"split": "train", "index": 0})
    body = {"name": "sleep", "input": {"seconds": 0.2}}
    async with http.post("/echoenv/call", json=body, headers={"X-Session-ID": sid}) as response:
        assert response.status == 200
        events = parse_sse(await response.text()).events
        return response.headers, [(name, "<id>" if name == "task_id" else data) for name, data in events]


@pytest.mark.parametrize("quick_result_s, one_response", [(30.0, True), (0.0, False)])
async def test_a_result_reads_the_same_in_one_response_or_streamed(
    monkeypatch: pytest.MonkeyPatch, quick_result_s: float, one_response: bool
) -> None:
    monkeypatch.setattr(bridge_app, "QUICK_RESULT_S", quick_result_s)
    async with bridge() as http:
        headers, events = await sleep_call(http)
    assert ("Content-Length" in headers) == one_response
    assert headers.get("Transfer-Encoding") == (None if one_response else "chunked")
    assert headers["Content-Type"] == "text/event-stream"
    assert events == [("task_id", "<id>"), ("end", '{"ok":true,"output":{"blocks":[{"text":"slept",'
                                                   '"detail":null,"type":"text"}],"metadata":null,'
                                                   '"reward":null,"finished":false}}')]
