"""The MCP door's edges, on real servers: the API key, hostile input, the MCP
Inspector CLI, 200 episodes at once, and the door in front of a remote backend."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from tests.support.mcp_door import (ENV, SERVE_ARGS, create_episode, episode_url, open_sessions, record,
                                    wait_for_open_sessions)
from tests.support.servers import ROOT, ServeProcess, start_bridge, start_serve
from tests.support.tooling import ensure_node_packages

API_KEY = "mcp-door-key"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
INSPECTOR_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[ServeProcess]:
    with start_serve(*SERVE_ARGS, "--api-key", API_KEY) as serve:
        yield serve


def _json_rpc_answer(body: str) -> dict[str, Any]:
    """The JSON-RPC message of a response body: JSON, or the first SSE `data:` line."""
    for line in body.splitlines():
        if line.startswith("data: ") and line[6:].strip():
            return json.loads(line[6:])
    return json.loads(body)


async def _post(url: str, body: bytes | str, headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=body, headers={**ACCEPT, **(headers or {})}) as response:
            return response.status, await response.text(), response.headers


async def test_the_api_key_is_asked_for_before_any_mcp_message_is_read(keyed_server):
    url = f"{keyed_server.mcp_url}/{ENV}/mcp?split=train&index=0"
    for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}):
        status, body, _ = await _post(url, b"not even JSON", headers)
        assert status == 401 and "API key" in json.loads(body)["detail"]

    status, body, response_headers = await _post(url, json.dumps(INITIALIZE), {"x-api-key": API_KEY})
    assert status == 200 and _json_rpc_answer(body)["result"]["instructions"]
    async with aiohttp.ClientSession() as http:  # end the MCP session: its episode goes
        await http.delete(url, headers={"x-api-key": API_KEY, "mcp-session-id": response_headers["mcp-session-id"]})

    bearer = create_mcp_http_client(headers={"Authorization": f"Bearer {API_KEY}"})
    async with Client(streamable_http_client(url, http_client=bearer), mode="legacy") as agent:
        added = await agent.call_tool("add", {"a": 1, "b": 2})
    assert added.content[0].text == "3"


async def test_an_unknown_environment_is_404_before_mcp(server):
    status, body, _ = await _post(f"{server.mcp_url}/nosuchenv/mcp/abc", json.dumps(INITIALIZE))
    assert status == 404 and "mcpenv" in json.loads(body)["detail"]


async def _open_mcp_session(url: str) -> str:
    status, _, headers = await _post(url, json.dumps(INITIALIZE))
    assert status == 200
    session_id = headers["mcp-session-id"]
    await _post(url, json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                {"mcp-session-id": session_id, "mcp-protocol-version": "2025-11-25"})
    return session_id


def _tools_call(arguments: Any, name: str = "echo") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


async def test_hostile_input_gets_4xx_or_json_rpc_errors_never_a_5xx_or_another_episodes_data(server, stub):
    mine, theirs = await create_episode(stub), await create_episode(stub, {"question": "THEIR-SECRET-TASK"})
    url = episode_url(server, mine)
    session = await _open_mcp_session(url)
    in_session = {"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
    hostile = {
        "malformed JSON": (url, b'{"jsonrpc": "2.0", "id": 1, "method": ', in_session),
        "not JSON-RPC": (url, json.dumps([1, 2, 3]), in_session),
        "an unknown method": (url, json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/destroy"}), in_session),
        "wrong types": (url, json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                         "params": {"name": 5, "arguments": "text"}}), in_session),
        "10 MB of params": (url, json.dumps(_tools_call({"text": "x" * 10_000_000})), in_session),
        "a lone surrogate": (url, '{"jsonrpc": "2.0", "id": 4, "method": "tools/call", '
                                  '"params": {"name": "echo", "arguments": {"text": "\\ud800"}}}', in_session),
        "another episode's URL with this MCP session": (episode_url(server, theirs), json.dumps(_tools_call(
            {"text": "hi"})), in_session),
        "an MCP session id nobody has": (url, json.dumps(_tools_call({"text": "hi"})),
                                         {**in_session, "mcp-session-id": "0" * 32}),
        "a request before initialize": (url, json.dumps(_tools_call({"text": "hi"})), {}),
    }
    answers = {what: await _post(*request) for what, request in hostile.items()}
    for what, (status, body, _) in answers.items():
        assert status < 500, what
        assert "Traceback" not in body and "THEIR-SECRET-TASK" not in body, what
        if status < 400:
            message = _json_rpc_answer(body)
            refused = "error" in message or message["result"].get("isError")
            assert refused, what
    assert answers["an unknown method"][0] == 200 and _json_rpc_answer(answers["an unknown method"][1])["error"][
        "code"] == -32601
    assert answers["an MCP session id nobody has"][0] == 404
    their_record = await record(stub, theirs)
    assert their_record.totals.calls == 0  # nothing ran in the other episode
    for sid in (mine, theirs):
        await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))


async def test_the_mcp_inspector_cli_lists_tools_and_calls_one(server, stub):
    ensure_node_packages(ROOT)
    sid = await create_episode(stub)
    inspector = [str(ROOT / "node_modules" / ".bin" / "mcp-inspector"), "--cli", episode_url(server, sid),
                 "--transport", "http"]
    listed = _run_inspector(inspector + ["--method", "tools/list"])
    called = _run_inspector(inspector + ["--method", "tools/call", "--tool-name", "add", "--tool-arg", "a=20", "b=22"])
    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
    assert {"add", "answer", "image"} <= {tool["name"] for tool in listed["tools"]}
    assert called["content"] == [{"type": "text", "text": "42"}] and called["isError"] is False
    assert called["_meta"]["ors/reward"] == 0


def _run_inspector(command: list[str]) -> Any:
    done = subprocess.run(command, capture_output=True, text=True, timeout=INSPECTOR_TIMEOUT_S, cwd=Path(ROOT))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_200_concurrent_mcp_episodes_lose_nothing_and_leave_no_session(server, stub):
    before = await open_sessions(stub)

    async def episode(index: int) -> tuple[float, bool]:
        task = json.dumps({"question": f"q{index}", "answer": str(index)})
        async with Client(f"{server.mcp_url}/{ENV}/mcp?task={task}", mode="legacy") as agent:
            added = await agent.call_tool("add", {"a": index, "b": 0})
            assert added.content[0].text == str(index)
            answered = await agent.call_tool("answer", {"answer": str(index)})
        return answered.meta["ors/reward"], answered.meta["ors/finished"]

    outcomes = await asyncio.gather(*(episode(i) for i in range(200)), return_exceptions=True)
    lost = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert lost == [] and outcomes == [(1.0, True)] * 200
    assert await wait_for_open_sessions(stub, before) == before


async def test_the_door_in_front_of_a_remote_backend(server, stub):
    sid = await create_episode(stub)
    with start_bridge(server.grpc_target, "--mcp-port", "0") as bridge:
        async with Client(f"{bridge.mcp_url}/{ENV}/mcp/{sid}", mode="auto") as agent:
            answered = await agent.call_tool("answer", {"answer": "5"})
    assert answered.meta == {"ors/finished": True, "ors/reward": 1.0,
                             "io.modelcontextprotocol/serverInfo": answered.meta["io.modelcontextprotocol/serverInfo"]}
    assert (await record(stub, sid)).totals.finished
    await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
