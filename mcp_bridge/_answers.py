"""How the door answers an MCP request: one JSON body when it can, SSE when it must.

An SSE answer costs the SDK about twice the CPU of a JSON one, and the door
needs SSE only for progress notifications, which a client asks for with a
progress token. So a POST whose body names a `progressToken` is answered as
the SDK answers in SSE mode; any other as JSON, turned into
`text/event-stream` with `: ping` comments only if its answer is not ready
within `keepalive_s` (a proxy's idle timeout must not cut a long tool call or
a slow setup). An `initialize` answer must carry the MCP session id the SDK
minted, which the door's `initialize` handler passes on with
`tell_session_id` before its slow part.

The choice reaches the SDK as its `json_response` flag, which it reads per
request, in the request's task: a context variable set by the body watcher
below names that task; in any other task (the MCP session's own, where the
SDK routes notifications) the flag reads False. The SDK's range is pinned
(`mcp>=2.3,<2.4`) and the tests pin both answers. Figures: docs/benchmarks.md,
"The MCP door next to the HTTP bridge".
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["JSON_WHEN_CHOSEN", "serve_choosing_answers", "tell_session_id"]

_PROGRESS_KEY = b'"progressToken"'
#: Where an opening request's scope carries the MCP session id its answer will name.
_SESSION_ID_SCOPE_KEY = "ors.mcp_session_id"
#: The task of the request being answered as JSON. A task, not a flag: tasks the
#: request's task starts (the SDK starts an MCP session's task from its opening
#: request) inherit the variable, and must read False.
_answering_as_json: contextvars.ContextVar[Optional[asyncio.Task[Any]]] = contextvars.ContextVar(
    "ors_mcp_answering_as_json", default=None)


class _ChosenPerRequest:
    """The session manager's `json_response`: true in the task of a request the door answers as JSON."""

    def __bool__(self) -> bool:
        task = _answering_as_json.get()
        return task is not None and task is asyncio.current_task()

    def __repr__(self) -> str:
        return "<json_response chosen per request>"


JSON_WHEN_CHOSEN = _ChosenPerRequest()


def tell_session_id(scope: Scope, session_id: Optional[str]) -> None:
    """The MCP session an `initialize` opens, for its answer's headers should it turn to SSE."""
    if session_id is not None:
        scope[_SESSION_ID_SCOPE_KEY] = session_id.encode("ascii")


async def serve_choosing_answers(app: ASGIApp, scope: Scope, receive: Receive, send: Send, keepalive_s: float) -> None:
    """Serve one HTTP request with `app` (the SDK's session manager), choosing its answer's form."""
    if scope["method"] != "POST":
        await app(scope, receive, send)
        return
    exchange = _Exchange(scope, receive, send, keepalive_s)
    try:
        await app(scope, exchange.receive, exchange.send)
    finally:
        exchange.stop_keepalive()


class _Exchange:
    """One POST answered as JSON unless it names a progress token, turned into SSE if its answer is slow."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, keepalive_s: float) -> None:
        self._scope = scope
        self._receive = receive
        self._send = send
        self._keepalive_s = keepalive_s
        self._body_tail = b""
        self._names_progress = False
        self._body_read = False
        self._answer_started = False
        self._sse_committed = False
        self._answer_body: list[bytes] = []
        self._sending: Optional[asyncio.Lock] = None  # made with the keepalive task: the only other sender
        # A timer, not a task, until it is due: nearly every answer comes first.
        self._keepalive_due: Optional[asyncio.TimerHandle] = None
        self._keepalive: Optional[asyncio.Task[None]] = None

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request" and not self._body_read:
            self._watch(message.get("body", b""))
            if not message.get("more_body", False):
                self._body_read = True
                if not self._names_progress:
                    _answering_as_json.set(asyncio.current_task())
                    self._arm_keepalive()
        return message

    def _watch(self, chunk: bytes) -> None:
        """Whether the body names a progress token, across chunk boundaries, without keeping the body."""
        window = self._body_tail + chunk[: len(_PROGRESS_KEY)]
        self._names_progress = self._names_progress or _PROGRESS_KEY in chunk or _PROGRESS_KEY in window
        self._body_tail = (self._body_tail + chunk[-len(_PROGRESS_KEY):])[-(len(_PROGRESS_KEY) - 1):]

    def _arm_keepalive(self) -> None:
        self._keepalive_due = asyncio.get_running_loop().call_later(self._keepalive_s, self._keepalive_is_due)

    def _keepalive_is_due(self) -> None:
        self._sending = asyncio.Lock()
        self._keepalive = asyncio.get_running_loop().create_task(self._keep_alive())

    def _sse_headers(self) -> Optional[list[tuple[bytes, bytes]]]:
        """The SSE answer's headers, or None while the MCP session id it must name is not known yet."""
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform")]
        session_id = self._scope.get(_SESSION_ID_SCOPE_KEY) or _header(self._scope, b"mcp-session-id")
        if session_id is not None:
            return [*headers, (b"mcp-session-id", session_id)]
        if _header(self._scope, b"mcp-protocol-version") is None:
            return None  # an `initialize`: the SDK mints the session id in a moment
        return headers  # the 2026-07-28 revision has no MCP sessions

    async def _keep_alive(self) -> None:
        """`keepalive_s` passed without an answer: SSE headers, then a ping every `keepalive_s`."""
        assert self._sending is not None
        async with self._sending:
            if self._answer_started:
                return
            headers = self._sse_headers()
            if headers is None:
                self._arm_keepalive()
                return
            await self._send({"type": "http.response.start", "status": 200, "headers": headers})
            self._sse_committed = True
        while True:
            await asyncio.sleep(self._keepalive_s)
            async with self._sending:
                await self._send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})

    def stop_keepalive(self) -> None:
        if self._keepalive_due is not None:
            self._keepalive_due.cancel()
        if self._keepalive is not None:
            self._keepalive.cancel()

    async def send(self, message: Message) -> None:
        if self._sending is None:  # no keepalive began: the SDK is the only sender
            await self._pass_on(message)
            return
        async with self._sending:
            if self._sse_committed:
                await self._into_sse(message)
            else:
                await self._pass_on(message)

    async def _pass_on(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._answer_started = True
            self.stop_keepalive()
        await self._send(message)

    async def _into_sse(self, message: Message) -> None:
        """The SDK's JSON answer as the SSE stream's one event; its status line and headers are dropped
        (SSE's went out already)."""
        if message["type"] != "http.response.body":
            return
        self._answer_body.append(message.get("body", b""))
        if not message.get("more_body", False):
            self.stop_keepalive()
            await self._send({"type": "http.response.body", "body": _sse_event(b"".join(self._answer_body)),
                              "more_body": False})


def _header(scope: Scope, name: bytes) -> Optional[bytes]:
    return next((value for key, value in scope["headers"] if key == name), None)


def _sse_event(json_body: bytes) -> bytes:
    """A JSON-RPC answer as one SSE `message` event (a `data:` line per line of its text)."""
    lines = b"".join(b"data: " + line + b"\r\n" for line in json_body.splitlines() or [b""])
    return b"event: message\r\n" + lines + b"\r\n"
