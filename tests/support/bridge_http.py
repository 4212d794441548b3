"""Test helpers for raw HTTP against the bridge: SSE parsing and common calls."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class SSEStream:
    """The parsed body of an SSE response."""

    events: list[tuple[str, str]] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    #: The `reason:` field of events that carry one (an `error` standing for a status), by event name.
    reasons: dict[str, str] = field(default_factory=dict)

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    def data(self, name: str) -> str:
        return next(data for event, data in self.events if event == name)

    def result(self) -> Any:
        """The RunToolOutput carried by `chunk`* + `end`, joined and parsed."""
        return json.loads("".join(data for name, data in self.events if name in ("chunk", "end")))


def parse_sse(text: str) -> SSEStream:
    stream = SSEStream()
    name, data, reason = None, [], None
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if not line:
            if name is not None:
                stream.events.append((name, "\n".join(data)))
                if reason is not None:
                    stream.reasons[name] = reason
            name, data, reason = None, [], None
        elif line.startswith(":"):
            stream.comments.append(line[1:].strip())
        else:
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
            elif key == "reason":
                reason = value
    return stream


async def read_sse(response: aiohttp.ClientResponse) -> SSEStream:
    return parse_sse(await response.text())


async def new_session_id(http: aiohttp.ClientSession) -> str:
    async with http.post("/create_session") as response:
        assert response.status == 200
        return (await response.json())["sid"]


async def create_episode(http: aiohttp.ClientSession, body: dict[str, Any], **headers: str) -> str:
    sid = await new_session_id(http)
    async with http.post("/create", json=body, headers={"X-Session-ID": sid, **headers}) as response:
        assert response.status == 200, await response.text()
        assert await response.json() == {"sid": sid}
    return sid


async def call(http: aiohttp.ClientSession, sid: str, name: str, tool_input: dict[str, Any], **extra: Any) -> SSEStream:
    body = {"name": name, "input": tool_input, **extra}
    async with http.post("/echoenv/call", json=body, headers={"X-Session-ID": sid}) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        return await read_sse(response)
