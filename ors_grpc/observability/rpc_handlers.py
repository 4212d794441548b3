"""Wrapping the behavior of a gRPC method handler, for the server interceptors that observe every RPC
(tracing, metrics)."""

from __future__ import annotations

from typing import Any, Callable

import grpc

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def wrap_behavior(handler: grpc.RpcMethodHandler, unary: Wrap, stream: Wrap) -> grpc.RpcMethodHandler:
    """`handler` with its behavior wrapped: by `unary` for a unary RPC, by `stream` for a
    server-streaming or bidirectional one (this service has no client-streaming RPCs)."""
    if handler.unary_unary:
        return handler._replace(unary_unary=unary(handler.unary_unary))
    if handler.unary_stream:
        return handler._replace(unary_stream=stream(handler.unary_stream))
    if handler.stream_stream:
        return handler._replace(stream_stream=stream(handler.stream_stream))
    return handler
