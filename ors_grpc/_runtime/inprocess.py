"""A gRPC channel to a servicer in the same process and event loop.

`ors-grpc serve --http-port` runs the HTTP bridge beside the gRPC service.
Over a loopback socket every call would be serialized and parsed twice more
and cross HTTP/2 twice, on the one event loop that also serves both doors.
This channel gives the bridge the same generated stub, hands the request
messages to the same method handlers through the same server interceptors
(metrics, API key), and fails with the same `grpc.aio.AioRpcError` (code,
details, `ors-error-reason` trailing metadata), so the bridge stays a
translator onto the gRPC contract and cannot tell the difference.

Only the transport is skipped: messages are passed by reference (neither
side mutates what it has sent). The message limit still applies: a request
over `max_message_bytes` fails with RESOURCE_EXHAUSTED as grpc would fail it,
and answers over it are refused by the service itself
(ERROR_REASON_MESSAGE_TOO_LARGE), so both HTTP doors have one limit.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
from typing import Any, AsyncIterator, Awaitable, Callable, NamedTuple, Optional, Sequence

import grpc

__all__ = ["InProcessChannel"]

Metadata = Sequence[tuple[str, str]]


class _CallDetails(NamedTuple):
    """What server interceptors see of a call (grpc.HandlerCallDetails)."""

    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


class _HandlerRegistry:
    """Collects the method handlers a generated `add_*Servicer_to_server` registers."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, generic_handlers: Sequence[Any]) -> None:
        pass  # the same handlers arrive through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            self.handlers[f"/{service}/{name}"] = handler


class _Abort(grpc.aio.AbortError):
    """Raised by `_Context.abort`, as grpc.aio raises AbortError."""


class _Context:
    """The part of grpc.aio.ServicerContext the service and interceptors use."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata
        self._code: Optional[grpc.StatusCode] = None
        self._details = ""
        self._trailing: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Metadata = ()) -> None:
        self._code, self._details = code, details
        if trailing_metadata:
            self._trailing = tuple(trailing_metadata)
        raise _Abort(details)

    async def send_initial_metadata(self, initial_metadata: Metadata) -> None:
        """Nothing to send in-process: no proxy stands between."""

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def set_trailing_metadata(self, trailing_metadata: Metadata) -> None:
        self._trailing = tuple(trailing_metadata)

    def code(self) -> Optional[grpc.StatusCode]:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing

    def peer(self) -> str:
        return "in-process"

    def time_remaining(self) -> None:
        return None

    def failed(self) -> bool:
        return self._code not in (None, grpc.StatusCode.OK)

    def rpc_error(self, code: Optional[grpc.StatusCode] = None, details: Optional[str] = None) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(
            code or self._code or grpc.StatusCode.UNKNOWN,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(*self._trailing),
            details=self._details if details is None else details,
        )


def _unexpected(context: _Context, exc: BaseException) -> grpc.aio.AioRpcError:
    # As on the wire: an exception that is not an abort is UNKNOWN.
    return context.rpc_error(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")


class _StreamCall:
    """A server-streaming call: the handler runs in its own task, as on a
    server, and `read()` takes its messages in order (grpc.aio's API)."""

    _END = object()

    def __init__(
        self, open_stream: Callable[[_Context], Awaitable[Optional[AsyncIterator[Any]]]], context: _Context,
        name: str,
    ) -> None:
        self._context = context
        # Messages nobody has read yet, and the read waiting for the next one:
        # one reader, a few messages a call (an asyncio.Queue would be more).
        self._messages: collections.deque[Any] = collections.deque()
        self._reader: Optional[asyncio.Future[Any]] = None
        self._error: Optional[grpc.aio.AioRpcError] = None
        self._ended = False
        # Named by its method: a task without a name has one formatted for it.
        self.task = asyncio.get_running_loop().create_task(self._run(open_stream), name=name)

    def _put(self, message: Any) -> None:
        reader, self._reader = self._reader, None
        if reader is None or reader.done():  # (a read that was cancelled leaves the message for the next)
            self._messages.append(message)
        else:
            self._answer(reader, message)

    async def _run(self, open_stream: Callable[[_Context], Awaitable[Optional[AsyncIterator[Any]]]]) -> None:
        try:
            messages = await open_stream(self._context)  # the handler's messages (None: it wrote none)
            if messages is not None:
                async for message in messages:
                    self._put(message)
            if self._context.failed():
                self._error = self._context.rpc_error()
        except _Abort:
            self._error = self._context.rpc_error()
        except grpc.aio.AioRpcError as exc:  # no such method
            self._error = exc
        except Exception as exc:
            self._error = _unexpected(self._context, exc)
        finally:
            self._put(self._END)

    def read(self) -> asyncio.Future[Any]:
        """The next message, EOF after the last, or the call's error: a future
        (grpc.aio's is a coroutine; a future is awaited alike, and a caller that
        waits for it with a timeout needs no task of its own around it)."""
        reader = self.task.get_loop().create_future()
        if self._ended:
            reader.set_result(grpc.aio.EOF)
        elif self._messages:
            self._answer(reader, self._messages.popleft())
        else:
            self._reader = reader
        return reader

    def _answer(self, reader: asyncio.Future[Any], message: Any) -> None:
        if message is not self._END:
            reader.set_result(message)
            return
        self._ended = True
        if self._error is not None:
            reader.set_exception(self._error)
        else:
            reader.set_result(grpc.aio.EOF)

    def cancel(self) -> bool:
        """Cancel the handler (a tool call's own task is not the handler's)."""
        return self.task.cancel()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while (message := await self.read()) is not grpc.aio.EOF:
            yield message


class InProcessChannel:
    """A `grpc.aio.Channel` stand-in for generated stubs: calls go straight to
    `servicer` (added with `add_servicer`, the generated
    `add_*Servicer_to_server` function), through `interceptors` in order."""

    def __init__(
        self,
        servicer: Any,
        add_servicer: Callable[[Any, Any], None],
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        *,
        max_message_bytes: Optional[int] = None,
    ) -> None:
        self._max_message_bytes = max_message_bytes
        registry = _HandlerRegistry()
        add_servicer(servicer, registry)
        self._handlers = registry.handlers
        self._interceptors = tuple(interceptors)
        # Their chain, built once: each call goes through the same links, each
        # interceptor's `intercept_service` called with the next as its continuation.
        continuation: Callable[[_CallDetails], Any] = self._lookup
        for interceptor in reversed(self._interceptors):
            continuation = functools.partial(interceptor.intercept_service, continuation)
        self._intercepted = continuation
        self._streams: set[asyncio.Task[None]] = set()

    async def drain(self, grace: Optional[float]) -> None:
        """Wait up to `grace` seconds for the streaming calls in flight (tool
        calls) to end, as grpc.aio's `Server.stop(grace)` does; None waits not
        at all."""
        if grace and self._streams:
            await asyncio.wait(set(self._streams), timeout=grace)

    def _check_size(self, request: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        """RESOURCE_EXHAUSTED for a request over the limit, as grpc answers it."""
        if self._max_message_bytes is None:
            return
        size = request.ByteSize()
        if size > self._max_message_bytes:
            raise _Context(metadata).rpc_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({size} vs. {self._max_message_bytes})",
            )

    async def _lookup(self, details: _CallDetails) -> Optional[grpc.RpcMethodHandler]:
        return self._handlers.get(details.method)

    async def _handler(self, method: str, metadata: tuple[tuple[str, str], ...]) -> grpc.RpcMethodHandler:
        handler = await self._intercepted(_CallDetails(method, metadata))
        if handler is None:
            raise _Context(metadata).rpc_error(grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {method}")
        return handler

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        async def call(request: Any, *, metadata: Optional[Metadata] = None, **_: Any) -> Any:
            invocation_metadata = tuple(metadata or ())
            self._check_size(request, invocation_metadata)
            handler = await self._handler(method, invocation_metadata)
            context = _Context(invocation_metadata)
            try:
                response = handler.unary_unary(request, context)
                if inspect.isawaitable(response):
                    response = await response
            except _Abort:
                raise context.rpc_error() from None
            except Exception as exc:
                raise _unexpected(context, exc) from exc
            if context.failed():
                raise context.rpc_error()
            return response

        return call

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Callable[..., _StreamCall]:
        def call(request: Any, *, metadata: Optional[Metadata] = None, **_: Any) -> _StreamCall:
            invocation_metadata = tuple(metadata or ())
            self._check_size(request, invocation_metadata)

            async def open_stream(context: _Context) -> Optional[AsyncIterator[Any]]:
                handler = await self._handler(method, invocation_metadata)
                messages = handler.unary_stream(request, context)
                if inspect.isawaitable(messages):  # a handler that only aborts or writes
                    await messages
                    return None
                return messages

            stream = _StreamCall(open_stream, _Context(invocation_metadata), method)
            self._streams.add(stream.task)
            stream.task.add_done_callback(self._streams.discard)
            return stream

        return call

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        """Bidirectional RPCs (RunEpisode) are not served in process: the
        bridge makes one call per step. Calling one fails UNIMPLEMENTED."""

        def call(*_: Any, metadata: Optional[Metadata] = None, **__: Any) -> Any:
            context = _Context(tuple(metadata or ()))
            raise context.rpc_error(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not served in process")

        return call

    async def close(self, grace: Optional[float] = None) -> None:
        """Nothing to close: the server owns the servicer."""

    async def __aenter__(self) -> "InProcessChannel":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()
