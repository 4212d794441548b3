"""A small Server-Sent Events writer on `aiohttp.web.StreamResponse`.

ORS serves SSE to POST requests (`/create_session`, `/{env}/call`), which
generic SSE helpers do not all support; this writer is all ORS needs: named
events, comment keepalives, and chunking of a long payload.
"""

from __future__ import annotations

import asyncio
import re
from typing import Awaitable, TypeVar

from aiohttp import web

__all__ = ["CHUNK_CHARS", "SSEWriter", "wants_event_stream"]

#: Characters per `chunk`/`end` event, as in the reference server.
CHUNK_CHARS = 4096

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",
}

_LINE_BREAK = re.compile(r"\r\n|\r|\n")

T = TypeVar("T")


def _frame(name: str, data: str) -> str:
    """One SSE event. A line break inside data (SSE knows three) must become
    a new `data:` line; clients join the lines back with "\n"."""
    if "\n" not in data and "\r" not in data:  # the common case, and much faster
        return f"event: {name}\ndata: {data}\n\n"
    lines = "".join(f"data: {line}\n" for line in _LINE_BREAK.split(data))
    return f"event: {name}\n{lines}\n"


def wants_event_stream(request: web.Request) -> bool:
    return "text/event-stream" in request.headers.get("Accept", "")


class SSEWriter:
    """Writes SSE events to one HTTP response; `start()` sends the headers."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._response = web.StreamResponse(status=200, headers=SSE_HEADERS)

    @property
    def response(self) -> web.StreamResponse:
        return self._response

    async def start(self) -> None:
        # prepare() writes and flushes the status line and headers at once.
        await self._response.prepare(self._request)

    async def event(self, name: str, data: str) -> None:
        await self._response.write(_frame(name, data).encode())

    async def comment(self, text: str = "ping") -> None:
        await self._response.write(f": {text}\n\n".encode())

    async def chunked(self, payload: str) -> None:
        """The payload as `chunk`* then `end`, CHUNK_CHARS characters each."""
        pieces = [payload[i : i + CHUNK_CHARS] for i in range(0, len(payload), CHUNK_CHARS)] or [""]
        names = ["chunk"] * (len(pieces) - 1) + ["end"]
        # One write for all events: a large result (an 8 MiB image is ~2,700
        # events) costs far more in per-write overhead than in encoding.
        await self._response.write("".join(map(_frame, names, pieces)).encode())

    def client_gone(self) -> bool:
        transport = self._request.transport
        return transport is None or transport.is_closing()

    async def await_with_keepalive(self, awaitable: Awaitable[T], interval_s: float) -> T:
        """Await `awaitable`, sending `: ping` every `interval_s` meanwhile.

        Raises ConnectionResetError when the client has gone away; the
        awaitable is then cancelled (the caller's watching, not the work it
        watches).
        """
        waiting = asyncio.ensure_future(awaitable)
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=interval_s)
                if done:
                    return waiting.result()
                if self.client_gone():
                    raise ConnectionResetError("client disconnected")
                await self.comment()
        finally:
            if not waiting.done():
                waiting.cancel()

    async def finish(self) -> None:
        await self._response.write_eof()
