"""Server-Sent Events for ORS: whole event streams and a small streaming writer.

ORS serves SSE to POST requests (`/create_session`, `/{env}/call`), which
generic SSE helpers do not all support; this is all ORS needs: named events,
comment keepalives, and chunking of a long payload. When every event is
known up front (a session id, a tool result that came quickly) the stream is
one ordinary response, sent in one write; `SSEWriter` streams the rest.
"""

from __future__ import annotations

import asyncio
import functools
import re
from typing import Any, Iterable

from aiohttp import web

__all__ = [
    "CHUNK_CHARS", "Event", "SSEWriter", "chunk_events", "done_within", "error_event", "sse_response",
    "wants_event_stream",
]

#: Characters per `chunk`/`end` event, as in the reference server.
CHUNK_CHARS = 4096

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",
}

_LINE_BREAK = re.compile(r"\r\n|\r|\n")

#: One SSE event: its name and its data; an `error` event may carry a third
#: item, the ORS reason of the status it stands for (`error_event`).
Event = tuple[str, ...]


def _wake(waiter: asyncio.Future[None], _: Any = None) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def done_within(future: asyncio.Future[Any], seconds: float) -> None:
    """Returns once `future` is done or `seconds` have passed, whichever is
    first, leaving `future` as it is: `asyncio.wait({future}, timeout=seconds)`
    for a third of its cost (every `/call` waits once)."""
    if future.done():
        return
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    wake = functools.partial(_wake, waiter)
    timer = loop.call_later(seconds, wake)
    future.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        future.remove_done_callback(wake)


def _frame(name: str, data: str, reason: str = "") -> str:
    """One SSE event. A line break inside data (SSE knows three) must become
    a new `data:` line; clients join the lines back with "\n". A `reason`
    is a field line of its own, which SSE parsers that do not know it skip."""
    head = f"event: {name}\nreason: {reason}\n" if reason else f"event: {name}\n"
    if "\n" not in data and "\r" not in data:  # the common case, and much faster
        return f"{head}data: {data}\n\n"
    lines = "".join(f"data: {line}\n" for line in _LINE_BREAK.split(data))
    return f"{head}{lines}\n"


def _frames(events: Iterable[Event]) -> bytes:
    return "".join([_frame(*event) for event in events]).encode()


def error_event(message: str, reason: str | None) -> Event:
    """An `error` event: `message` as its data, and the ORS reason of the
    status it stands for (`ERROR_REASON_ENVIRONMENT_CRASHED`), if any, in a
    `reason:` field."""
    return ("error", message, reason) if reason else ("error", message)


def chunk_events(payload: str) -> list[Event]:
    """The payload as `chunk`* then `end` events, CHUNK_CHARS characters each."""
    if len(payload) <= CHUNK_CHARS:  # most payloads
        return [("end", payload)]
    pieces = [payload[i : i + CHUNK_CHARS] for i in range(0, len(payload), CHUNK_CHARS)]
    return [("chunk", piece) for piece in pieces[:-1]] + [("end", pieces[-1])]


def sse_response(events: Iterable[Event]) -> web.Response:
    """A whole event stream as one response (headers and events in one write)."""
    return web.Response(body=_frames(events), headers=SSE_HEADERS)


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

    async def events(self, events: Iterable[Event]) -> None:
        # One write for all: a large result (an 8 MiB image is ~2,700 events)
        # costs far more in per-write overhead than in encoding.
        await self._response.write(_frames(events))

    async def comment(self, text: str = "ping") -> None:
        await self._response.write(f": {text}\n\n".encode())

    def client_gone(self) -> bool:
        transport = self._request.transport
        return transport is None or transport.is_closing()

    async def wait_with_keepalive(self, future: asyncio.Future, interval_s: float) -> None:
        """Wait until `future` is done (its result or exception is the
        caller's to read), sending `: ping` every `interval_s` meanwhile.

        Raises ConnectionResetError when the client has gone away.
        """
        while not future.done():
            await done_within(future, interval_s)
            if future.done():
                return
            if self.client_gone():
                raise ConnectionResetError("client disconnected")
            await self.comment()

    async def finish(self) -> None:
        await self._response.write_eof()
