"""The HTTP port's own policies, below the routes: limits, timeouts, client errors, logging.

- Request heads: header lines up to `max_header_bytes` (an `X-Secrets` of
  several keys or a service-account JSON is tens of kilobytes), the whole
  head up to `max_head_bytes` and `max_headers` header lines (431 with a JSON
  `detail` over either, counted before aiohttp's parser keeps the bytes, so
  that many huge heads cannot swell the server); the head must
  arrive within `header_timeout_s` of the connection opening or of the
  previous answer (aiohttp's keep-alive timer, which also closes idle
  connections then).
- Request bodies must arrive within `body_timeout_s`, and one declared over
  the app's `client_max_size` is refused before it is read (`check_request`,
  `receive_body`).
- At most `max_connections` connections; one more is answered 503 and closed.
- Every client error, aiohttp's own parser errors included, is JSON
  `{"detail": ...}` with at most one WARNING line, no traceback.
- Logging policy: no request bytes reach a log line or an error text. Parser
  errors are described by their kind only (aiohttp's message quotes the
  offending bytes, which may be a secret); text that cannot become protobuf
  is named by where it was (header, path), never shown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from dataclasses import dataclass
from typing import Any, Optional

from aiohttp import http_exceptions, web
from aiohttp.web_protocol import RequestHandler

from ors_grpc.protocol.constants import MAX_REQUEST_HEAD_BYTES, MAX_REQUEST_HEADERS

from . import _convert as convert

__all__ = ["HttpLimits", "GuardedRunner", "body_pending", "check_request", "default_max_connections", "receive_body"]

logger = logging.getLogger("http_bridge")

#: Largest request line or header line: `X-Secrets` is base64 JSON, so 64 KiB
#: of secrets take about 86 KiB.
MAX_HEADER_BYTES = 128 * 1024
HEADER_TIMEOUT_S = 30.0
BODY_TIMEOUT_S = 60.0

def default_max_connections() -> int:
    """Three quarters of the process's file descriptors (the rest are for the
    gRPC side, files and user code), and at most 10,000."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 10_000
    return max(16, min(10_000, soft * 3 // 4))


@dataclass(frozen=True)
class HttpLimits:
    """Limits of the HTTP port."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    #: None: `default_max_connections()`.
    max_connections: Optional[int] = None
    max_header_bytes: int = MAX_HEADER_BYTES
    max_head_bytes: int = MAX_REQUEST_HEAD_BYTES
    max_headers: int = MAX_REQUEST_HEADERS


LIMITS = web.AppKey("http_limits", HttpLimits)


# --------------------------------------------------------------------------
# Every request, before its route: text that can become protobuf, a body in time
# --------------------------------------------------------------------------


def check_request(request: web.Request) -> None:
    """413 for a declared body over the app's `client_max_size`, before
    anything reads it; 400 (BadRequest) for a path or header that is not
    UTF-8 text (aiohttp keeps undecodable bytes as lone surrogates, which
    protobuf refuses). Run before every route, so a new route is covered
    without a change of its own."""
    limit = request.client_max_size
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    convert.check_text(request.path, "the URL path")
    headers = request.headers
    if not "".join(headers.values()).isascii():  # (only text beyond ASCII can hold a lone surrogate)
        for name, value in headers.items():
            convert.check_text(value, f"the {name} header")


def body_pending(request: web.Request) -> bool:
    """Whether some of the request's body has yet to arrive (a small body
    arrives with its head: no wait to bound, no timer for it)."""
    return request.body_exists and not request.content.is_eof()


async def receive_body(request: web.Request) -> Optional[web.Response]:
    """Read the rest of the body (kept by aiohttp: the route's read() gets
    it); a 408 answer if it does not arrive within the body timeout."""
    try:
        async with asyncio.timeout(request.app[LIMITS].body_timeout_s):
            await request.read()
    except TimeoutError:
        logger.warning("http_client_error status=408 error=body_timeout")
        response = web.Response(
            status=408, text=convert.dumps({"detail": "Request body not received in time"}),
            content_type="application/json",
        )
        response.force_close()
        return response
    return None


# --------------------------------------------------------------------------
# The server: connection cap, and aiohttp's own errors as JSON
# --------------------------------------------------------------------------


class RequestHeadTooLarge(http_exceptions.BadHttpMessage):
    """A request head over `max_head_bytes` or `max_headers` (answered 431)."""


class _HeadBoundParser:
    """aiohttp's request parser, refusing a request head over the limits
    before the parser takes its bytes in: aiohttp bounds each line only, so
    100 lines of 127 KiB (a 12 MB head) would otherwise be parsed and kept.
    Bytes count toward a head from the end of the previous request's body up
    to the blank line that ends the head; a body's bytes never do. After a
    refusal the rest of the connection's bytes are dropped. A head that holds
    one line over aiohttp's own line limit is left to aiohttp (400, "line too
    long") whichever limit its bytes reach first, so that the answer does not
    depend on how the socket cut them into reads."""

    def __init__(self, parser: Any, max_head_bytes: int, max_headers: int, max_line_bytes: int) -> None:
        self._parser = parser
        self._max_head_bytes = max_head_bytes
        self._max_line_bytes = max_line_bytes
        self._line_bytes = 0  # of the head's last line so far (not yet ended by a newline)
        self._max_lines = max_headers + 1  # and the request line
        self._head_bytes = 0
        self._head_lines = 0
        self._tail = b""  # the head's last bytes so far: the blank line may span two chunks
        self._body: Any = None  # the last request's payload, while it is being received
        self._refused = False

    def feed_data(self, data: bytes) -> Any:
        if self._refused:
            return [], False, b""
        if (self._body is None or self._body.is_eof()) and not self._whole_head_within_limits(data):
            self._count_head(data)
        messages, upgraded, tail = self._parser.feed_data(data)
        if messages:
            self._head_bytes = self._head_lines = self._line_bytes = 0
            self._tail = b""
            self._body = messages[-1][1]
        return messages, upgraded, tail

    def _whole_head_within_limits(self, data: bytes) -> bool:
        """The common read: a whole head, from its first byte, within both
        limits. Nothing to carry over (the parser answers it at once), so
        `_count_head`'s line-by-line accounting is skipped."""
        if not data:  # (aiohttp feeds an empty read after each answer)
            return True
        if self._head_bytes or self._tail:
            return False
        end = data.find(b"\r\n\r\n", 0, self._max_head_bytes + 1)
        return end > 0 and data.count(b"\n", 0, end) < self._max_lines

    def _count_head(self, data: bytes) -> None:
        window = self._tail + data
        end = window.find(b"\r\n\r\n")
        head = data if end < 0 else data[: max(0, end - len(self._tail))]
        self._head_bytes += len(head)
        self._head_lines += head.count(b"\n")
        self._tail = window[-3:]
        longest_line = self._longest_line(head)
        if self._head_bytes > self._max_head_bytes and longest_line <= self._max_line_bytes:
            self._refuse(f"Request head too large (limit {self._max_head_bytes} bytes)")
        if self._head_lines >= self._max_lines + (end < 0):  # the last line's newline is the blank line's
            self._refuse(f"Too many request headers (limit {self._max_lines - 1})")

    def _longest_line(self, head: bytes) -> int:
        """The longest line `head` ends or continues (counting the line carried
        over from earlier reads); keeps the length of its unended last line."""
        first, newline, rest = head.partition(b"\n")
        longest = self._line_bytes + len(first)
        if not newline:
            self._line_bytes = longest
            return longest
        lines = rest.split(b"\n")
        self._line_bytes = len(lines[-1])
        return max(longest, *map(len, lines))

    def _refuse(self, detail: str) -> None:
        self._refused = True
        raise RequestHeadTooLarge(detail)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


def _parse_error_detail(exc: Optional[BaseException], max_header_bytes: int) -> str:
    """What a malformed request head was, by kind only: aiohttp's message
    quotes the request's bytes."""
    if isinstance(exc, RequestHeadTooLarge):
        return exc.message  # our own words, with no request bytes
    if isinstance(exc, http_exceptions.LineTooLong):
        return f"Request line or header too long (limit {max_header_bytes} bytes)"
    if isinstance(exc, http_exceptions.BadHttpMethod):
        return "Bad HTTP method"
    if isinstance(exc, http_exceptions.BadStatusLine):
        return "Bad HTTP request line"
    if isinstance(exc, http_exceptions.InvalidHeader):
        return "Invalid HTTP header"
    if isinstance(exc, http_exceptions.InvalidURLError):
        return "Invalid URL"
    if isinstance(exc, http_exceptions.PayloadEncodingError):
        return "Bad request body encoding"
    return "Bad HTTP request"


class _ClientErrorAnswering(RequestHandler):
    """aiohttp's connection handler, answering the requests it refuses itself
    (malformed heads, before any route) as JSON with one WARNING line, and
    closing a connection whose first request head is not in within the
    header timeout (aiohttp's keep-alive timer covers the heads after it, and
    the first one only since aiohttp 3.14)."""

    max_header_bytes = MAX_HEADER_BYTES
    header_timeout_s = HEADER_TIMEOUT_S
    _first_head_timer: Optional[asyncio.TimerHandle] = None

    def bound_heads(self, max_head_bytes: int, max_headers: int) -> None:
        """Refuse request heads over these limits (431); see `_HeadBoundParser`."""
        self._parser = _HeadBoundParser(self._parser, max_head_bytes, max_headers, self.max_header_bytes)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._first_head_timer = asyncio.get_running_loop().call_later(
            self.header_timeout_s, self._close_without_a_request
        )

    def _close_without_a_request(self) -> None:
        if getattr(self, "_request_count", 1) == 0:  # no request head parsed yet
            self.force_close()

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        if self._first_head_timer is not None:
            self._first_head_timer.cancel()
        super().connection_lost(exc)

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: Optional[BaseException] = None,
        message: Optional[str] = None,
    ) -> web.StreamResponse:
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, RequestHeadTooLarge):
            status = 431  # Request Header Fields Too Large (RFC 6585)
        logger.warning("http_client_error status=%d error=%s", status, type(exc).__name__ if exc else "none")
        if request.writer.output_size > 0:
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        detail = _parse_error_detail(exc, self.max_header_bytes)
        response = web.Response(
            status=status, text=json.dumps({"detail": detail}), content_type="application/json"
        )
        response.force_close()
        return response


_TOO_MANY_CONNECTIONS_BODY = b'{"detail":"Too many connections, retry shortly"}'
_TOO_MANY_CONNECTIONS = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: " + str(len(_TOO_MANY_CONNECTIONS_BODY)).encode() + b"\r\n"
    b"Retry-After: 1\r\nConnection: close\r\n\r\n" + _TOO_MANY_CONNECTIONS_BODY
)


class _RefuseConnection(asyncio.Protocol):
    """A connection over the cap: answered 503 at once, then closed when the
    client has read it and closed its side, or after REFUSED_LINGER_S.
    (Closing at once, with the client's request unread, would reset the
    connection before the client reads the answer.)"""

    REFUSED_LINGER_S = 1.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        transport.write(_TOO_MANY_CONNECTIONS)  # type: ignore[attr-defined]
        if transport.can_write_eof():  # type: ignore[attr-defined]
            transport.write_eof()  # type: ignore[attr-defined]
        self._timer = asyncio.get_running_loop().call_later(self.REFUSED_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # the request is not read

    def eof_received(self) -> bool:
        self._transport.close()
        return False

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self._timer.cancel()


class _GuardedServer(web.Server):
    """aiohttp's Server making `_ClientErrorAnswering` handlers, at most
    `max_connections` at a time."""

    max_connections = 10_000
    max_header_bytes = MAX_HEADER_BYTES
    max_head_bytes = MAX_REQUEST_HEAD_BYTES
    max_headers = MAX_REQUEST_HEADERS

    def __call__(self) -> Any:  # a protocol factory
        if len(self._connections) >= self.max_connections:
            logger.debug("http_connection_refused open=%d", len(self._connections))
            return _RefuseConnection()
        handler = _ClientErrorAnswering(self, loop=self._loop, **self._kwargs)
        handler.max_header_bytes = self.max_header_bytes
        handler.header_timeout_s = self._kwargs["keepalive_timeout"]
        handler.bound_heads(self.max_head_bytes, self.max_headers)
        return handler


class GuardedRunner(web.AppRunner):
    """An AppRunner whose server applies `limits` (see the module's doc)."""

    def __init__(self, app: web.Application, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(
            app,
            # aiohttp closes a connection whose handler waits for a request
            # head this long after it opened or answered: the header timeout.
            keepalive_timeout=limits.header_timeout_s,
            max_line_size=limits.max_header_bytes,
            max_field_size=limits.max_header_bytes,
            **kwargs,
        )
        self._limits = limits

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp has no hook for the handler class: make this Server ours.
        server.__class__ = _GuardedServer
        server.max_connections = self._limits.max_connections or default_max_connections()  # type: ignore[attr-defined]
        server.max_header_bytes = self._limits.max_header_bytes  # type: ignore[attr-defined]
        server.max_head_bytes = self._limits.max_head_bytes  # type: ignore[attr-defined]
        server.max_headers = self._limits.max_headers  # type: ignore[attr-defined]
        return server
