"""The bridge's side of the gRPC hop (shared with every door: `ors_grpc.protocol.door`)."""

from __future__ import annotations

from typing import Optional

from aiohttp import web

from ors_grpc.protocol import door
from ors_grpc.protocol.door import EnvNames, Metadata, error_reason, open_channel, retry_after

__all__ = ["EnvNames", "call_metadata", "error_reason", "open_channel", "retry_after"]


#: Where a request keeps its metadata without a session id, read from its headers once.
_REQUEST_METADATA = web.RequestKey("ors_grpc.call_metadata", tuple)


def call_metadata(request: web.Request, session_id: Optional[str] = None) -> Metadata:
    """The gRPC metadata of an HTTP request (`ors_grpc.protocol.door.call_metadata`); its
    headers are read once per request (the default-environment redirect asks too)."""
    metadata = request.get(_REQUEST_METADATA)
    if metadata is None:
        metadata = request[_REQUEST_METADATA] = door.call_metadata(request.headers)
    return door.with_session_id(metadata, session_id)
