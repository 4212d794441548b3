"""One ORS episode over HTTP/SSE with raw aiohttp: the same code drives the reference and our bridge.

Deliberately minimal (no ORS client library): the figures should measure the
servers, not a client's retries, pings or validation.
"""

import base64
import json
import uuid

import aiohttp

from ors_grpc.protocol.constants import SESSION_ID_HEADER

ENV = "benchenv"
SSE_ACCEPT = {"Accept": "text/event-stream"}


def parse_sse(body: bytes) -> list[tuple[str, bytes]]:
    """Split an SSE body into (event, data) pairs; comments (``: ping``) are skipped."""
    events: list[tuple[str, bytes]] = []
    event, data = "message", []
    for line in body.splitlines():
        if not line:
            if data:
                events.append((event, b"\n".join(data)))
            event, data = "message", []
        elif line.startswith(b"event:"):
            event = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    if data:
        events.append((event, b"\n".join(data)))
    return events


def run_tool_output(body: bytes) -> dict:
    """The RunToolOutput of a ``/call`` SSE body: its ``chunk`` pieces joined with the ``end`` piece."""
    pieces = []
    for event, data in parse_sse(body):
        if event == "error":
            raise RuntimeError(f"tool error event: {data[:200]!r}")
        if event in ("chunk", "end"):
            pieces.append(data)
    result = json.loads(b"".join(pieces))
    if not result.get("ok"):
        raise RuntimeError(f"tool refused: {result.get('error')}")
    return result["output"]


class PooledHttp:
    """A server at ``base_url``, driven through one pooled aiohttp session (``self.http``)."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.http: aiohttp.ClientSession | None = None

    async def __aenter__(self):
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        timeout = aiohttp.ClientTimeout(total=300)
        self.http = aiohttp.ClientSession(self.base_url, connector=connector, timeout=timeout)
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.http is not None
        await self.http.close()


class HttpDoor(PooledHttp):
    """An ORS HTTP server at ``base_url``, driven through one pooled aiohttp session."""

    async def _post(self, path: str, sid: str | None, body: dict | None = None, accept_sse: bool = False) -> bytes:
        headers = dict(SSE_ACCEPT) if accept_sse else {}
        if sid is not None:
            headers[SESSION_ID_HEADER] = sid
        async with self.http.post(path, json=body, headers=headers) as resp:
            payload = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"POST {path}: {resp.status} {payload[:200]!r}")
            return payload

    async def _get(self, path: str, sid: str) -> bytes:
        async with self.http.get(path, headers={SESSION_ID_HEADER: sid}) as resp:
            payload = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"GET {path}: {resp.status} {payload[:200]!r}")
            return payload

    async def new_session_id(self) -> str:
        events = parse_sse(await self._post("/create_session", None, accept_sse=True))
        return next(data.decode() for event, data in events if event == "task_id")

    async def open_episode(self, sid: str, target: int) -> None:
        """``/create`` then ``/prompt`` (which waits for setup)."""
        await self._post("/create", sid, {"env_name": ENV, "task_spec": {"target": target}})
        prompt = json.loads(await self._get(f"/{ENV}/prompt", sid))
        assert prompt and prompt[0]["type"] == "text", prompt

    async def call_tool(self, sid: str, name: str, tool_input: dict) -> dict:
        body = await self._post(f"/{ENV}/call", sid, {"name": name, "input": tool_input}, accept_sse=True)
        return run_tool_output(body)

    async def close_episode(self, sid: str) -> None:
        await self._post("/delete", sid)
        await self._post("/delete_session", sid)

    async def image_call(self, sid: str) -> int:
        """Call ``big_image``; returns the size of the image received, in raw bytes."""
        output = await self.call_tool(sid, "big_image", {})
        return len(base64.b64decode(output["blocks"][0]["data"]))

    async def open_idle_session(self) -> None:
        """A session left open for the memory measurement: created, setup done."""
        await self.open_episode(str(uuid.uuid4()), 10)

