"""One ORS episode through the MCP door with raw aiohttp, as an MCP agent runs it.

The convenience URL (`/benchenv/mcp?task=...`): `initialize` creates the
episode and answers its prompt as `instructions`, then
`notifications/initialized`, the same four steps and submit as the HTTP
episode (`tools/call`), and the HTTP DELETE that ends the MCP session deletes
the episode. Like `http_door`, no client library: the figures measure the server.
"""

import base64
import json
import time
import urllib.parse
from collections.abc import Callable

from bench.http_door import ENV, PooledHttp, parse_sse

REVISION = "2025-11-25"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def json_rpc_answer(body: bytes, content_type: str) -> dict:
    """The JSON-RPC answer of a POST: JSON, or the SSE event that carries an `id`."""
    if content_type.startswith("text/event-stream"):
        for _, data in parse_sse(body):
            message = json.loads(data)
            if "id" in message:
                return message
        raise RuntimeError(f"no answer in the SSE body {body[:200]!r}")
    return json.loads(body)


class McpDoor(PooledHttp):
    """The MCP door at ``base_url``, driven through one pooled aiohttp session."""

    async def _post(self, url: str, message: dict, headers: dict) -> tuple[dict | None, dict]:
        async with self.http.post(url, data=json.dumps(message), headers={**ACCEPT, **headers}) as resp:
            body = await resp.read()
            if resp.status >= 300:
                raise RuntimeError(f"POST {url}: {resp.status} {body[:200]!r}")
            if "id" not in message:
                return None, dict(resp.headers)
            return json_rpc_answer(body, resp.headers.get("content-type", "")), dict(resp.headers)

    async def _open(self, target: int) -> tuple[str, dict]:
        """A new MCP session on a new episode: its URL and the headers of its requests."""
        url = f"/{ENV}/mcp?task=" + urllib.parse.quote(json.dumps({"target": target}))
        initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": REVISION, "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}
        answer, headers = await self._post(url, initialize, {})
        if not answer.get("result", {}).get("instructions"):
            raise RuntimeError(f"initialize: {answer}")
        session = {"mcp-session-id": headers["mcp-session-id"], "mcp-protocol-version": REVISION}
        await self._post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
        return url, session

    async def _call(self, url: str, session: dict, request_id: int, name: str, arguments: dict) -> dict:
        message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                   "params": {"name": name, "arguments": arguments}}
        answer, _ = await self._post(url, message, session)
        result = answer.get("result")
        if result is None or result.get("isError"):
            raise RuntimeError(f"tools/call {name}: {answer}")
        return result

    async def _close(self, url: str, session: dict) -> None:
        async with self.http.delete(url, headers=session) as resp:
            await resp.read()

    async def episode(self, on_tool_call: Callable[[float], None], on_create: Callable[[float], None]) -> None:
        start = time.perf_counter()
        url, session = await self._open(10)
        on_create(time.perf_counter() - start)
        for n in (1, 2, 3, 4):
            start = time.perf_counter()
            await self._call(url, session, n, "step", {"n": n})
            on_tool_call(time.perf_counter() - start)
        start = time.perf_counter()
        result = await self._call(url, session, 5, "submit", {"answer": 10})
        on_tool_call(time.perf_counter() - start)
        if result["_meta"].get("ors/reward") != 1.0 or not result["_meta"]["ors/finished"]:
            raise RuntimeError(f"unexpected submit result: {result['_meta']}")
        await self._close(url, session)

    async def image_calls(self, count: int) -> tuple[int, list[float]]:
        """`big_image` `count` times in one MCP session (after one uncounted call)."""
        url, session = await self._open(10)
        latencies, size = [], 0
        for n in range(count + 1):
            start = time.perf_counter()
            result = await self._call(url, session, n + 1, "big_image", {})
            if n:
                latencies.append(time.perf_counter() - start)
            size = len(base64.b64decode(result["content"][0]["data"]))
        await self._close(url, session)
        return size, latencies
