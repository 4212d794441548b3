"""How the MCP door answers a request, on real servers: one JSON body, unless
the client asked for progress (SSE, as the SDK streams it) or the answer is
slow (SSE with `: ping` keepalives until the answer comes)."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any, AsyncIterator

import aiohttp
import pytest
from mcp import Client

from mcp_bridge import start_mcp_door
from tests.support.mcp_door import ENV, create_episode, episode_url, open_sessions, wait_for_open_sessions
from tests.support.servers import ServeProcess

#: The keepalive interval of the door these tests start (the default is 9 s).
KEEPALIVE_S = 0.5  # long enough that a quick call on a busy machine stays JSON
HANDSHAKE = "2025-11-25"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
async def quick_keepalive_door(server: ServeProcess) -> AsyncIterator[str]:
    """An MCP door onto the module's server whose answers turn to SSE after KEEPALIVE_S."""
    door, port = await start_mcp_door(server.grpc_target, keepalive_interval_s=KEEPALIVE_S)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await door.cleanup()


def _request(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def _initialize() -> dict[str, Any]:
    return _request(0, "initialize", {"protocolVersion": HANDSHAKE, "capabilities": {},
                                      "clientInfo": {"name": "answers-test", "version": "0"}})


def _call(request_id: int, name: str, arguments: dict[str, Any], progress_token: Any = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if progress_token is not None:
        params["_meta"] = {"progressToken": progress_token}
    return _request(request_id, "tools/call", params)


class Answer:
    """One HTTP answer of the door: its content type, MCP session id, SSE comments and JSON-RPC messages."""

    def __init__(self, status: int, headers: Any, body: str) -> None:
        self.status = status
        self.content_type = headers.get("content-type", "").split(";")[0]
        self.session_id = headers.get("mcp-session-id")
        if self.content_type == "text/event-stream":
            self.comments = [line for line in body.splitlines() if line.startswith(":")]
            self.messages = [json.loads(line[len("data: "):]) for line in body.splitlines()
                             if line.startswith("data: ") and line[len("data: "):].strip()]
        else:
            self.comments, self.messages = [], [json.loads(body)]

    @property
    def result(self) -> dict[str, Any]:
        answers = [message for message in self.messages if "id" in message]
        assert len(answers) == 1, self.messages
        return answers[0]["result"]


async def _post(url: str, message: dict[str, Any], session_id: str | None = None) -> Answer:
    headers = {**ACCEPT, **({"mcp-session-id": session_id, "mcp-protocol-version": HANDSHAKE} if session_id else {})}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=json.dumps(message), headers=headers) as response:
            return Answer(response.status, response.headers, await response.text())


async def _open(url: str) -> tuple[Answer, str]:
    """`initialize` and `notifications/initialized`: the answer and the MCP session id."""
    opened = await _post(url, _initialize())
    assert opened.status == 200 and opened.session_id, (opened.status, opened.messages)
    async with aiohttp.ClientSession() as http:
        notified = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        headers = {**ACCEPT, "mcp-session-id": opened.session_id, "mcp-protocol-version": HANDSHAKE}
        async with http.post(url, data=json.dumps(notified), headers=headers) as response:
            assert response.status == 202
    return opened, opened.session_id


async def _close(url: str, session_id: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.delete(url, headers={"mcp-session-id": session_id}) as response:
            assert response.status < 300


async def test_quick_answers_are_one_json_body(server, stub):
    url = episode_url(server, await create_episode(stub))
    opened, session_id = await _open(url)
    added = await _post(url, _call(1, "add", {"a": 2, "b": 3}), session_id)
    await _close(url, session_id)

    assert opened.content_type == "application/json" and opened.result["instructions"] == "What is 2+3?"
    assert added.content_type == "application/json" and added.result["content"][0]["text"] == "5"


async def test_a_call_that_asks_for_progress_is_answered_on_sse(server, stub):
    url = episode_url(server, await create_episode(stub))
    _, session_id = await _open(url)
    added = await _post(url, _call(1, "add", {"a": 2, "b": 3}, progress_token="p-1"), session_id)
    await _close(url, session_id)

    assert added.content_type == "text/event-stream"
    assert added.session_id == session_id and added.result["content"][0]["text"] == "5"


async def test_answers_are_chosen_per_request_within_one_mcp_session(server, stub):
    url = episode_url(server, await create_episode(stub))
    _, session_id = await _open(url)
    watched = asyncio.ensure_future(_post(url, _call(1, "sleep", {"seconds": 2.5}, progress_token="p-2"), session_id))
    quick = await asyncio.gather(*(_post(url, _call(n, "add", {"a": n, "b": 1}), session_id) for n in (2, 3, 4)))
    slept = await watched
    await _close(url, session_id)

    assert [(answer.content_type, answer.result["content"][0]["text"]) for answer in quick] == [
        ("application/json", "3"), ("application/json", "4"), ("application/json", "5")]
    assert slept.content_type == "text/event-stream" and slept.result["content"][0]["text"] == "slept"
    progress = [message for message in slept.messages if message.get("method") == "notifications/progress"]
    assert progress and progress[0]["params"]["progressToken"] == "p-2"


async def test_a_progress_token_split_across_body_chunks_still_asks_for_sse(server, stub):
    url = episode_url(server, await create_episode(stub))
    _, session_id = await _open(url)
    body = json.dumps(_call(1, "add", {"a": 2, "b": 3}, progress_token=7)).encode()
    cut = body.index(b'"progressToken"') + 5

    async def in_two_chunks() -> AsyncIterator[bytes]:
        yield body[:cut]
        yield body[cut:]

    headers = {**ACCEPT, "mcp-session-id": session_id, "mcp-protocol-version": HANDSHAKE}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=in_two_chunks(), headers=headers) as response:
            added = Answer(response.status, response.headers, await response.text())
    await _close(url, session_id)

    assert added.content_type == "text/event-stream" and added.result["content"][0]["text"] == "5"


async def test_a_slow_answer_turns_into_sse_with_keepalives(quick_keepalive_door, server, stub):
    url = f"{quick_keepalive_door}/{ENV}/mcp/{await create_episode(stub)}"
    _, session_id = await _open(url)
    slept = await _post(url, _call(1, "sleep", {"seconds": 5 * KEEPALIVE_S}), session_id)
    quick = await _post(url, _call(2, "add", {"a": 1, "b": 1}), session_id)
    await _close(url, session_id)

    assert slept.status == 200 and slept.content_type == "text/event-stream"
    assert slept.session_id == session_id
    assert len(slept.comments) >= 2 and set(slept.comments) == {": ping"}
    assert slept.result["content"][0]["text"] == "slept"
    assert quick.content_type == "application/json"  # the next quick answer is JSON again


async def test_a_slow_initialize_names_the_mcp_session_it_opens(quick_keepalive_door, stub):
    before = await open_sessions(stub)
    task = {"question": "What is 2+3?", "answer": "5", "setup_seconds": 5 * KEEPALIVE_S}
    url = f"{quick_keepalive_door}/{ENV}/mcp?task=" + urllib.parse.quote(json.dumps(task))
    opened, session_id = await _open(url)
    added = await _post(url, _call(1, "add", {"a": 2, "b": 3}), session_id)
    await _close(url, session_id)

    assert opened.content_type == "text/event-stream" and opened.comments
    assert opened.result["instructions"] == "What is 2+3?"
    assert added.result["content"][0]["text"] == "5"  # the session id of the SSE headers is the session's
    assert await wait_for_open_sessions(stub, before) == before


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_official_client_reads_slow_answers_in_both_generations(quick_keepalive_door, stub, mode):
    task = {"question": "What is 2+3?", "answer": "5", "setup_seconds": 3 * KEEPALIVE_S}
    sid = await create_episode(stub, task)
    async with Client(f"{quick_keepalive_door}/{ENV}/mcp/{sid}", mode=mode) as agent:
        assert agent.instructions == "What is 2+3?"  # waited for the slow setup
        slept = await agent.call_tool("sleep", {"seconds": 3 * KEEPALIVE_S})
        answered = await agent.call_tool("answer", {"answer": "5"})
    assert slept.content[0].text == "slept"
    assert answered.meta["ors/reward"] == 1.0 and answered.meta["ors/finished"] is True
