"""The bridge's side of the gRPC hop (shared with every door: `ors_grpc.protocol.door`)."""

from __future__ import annotations

from typing import Optional

from aiohttp import web

from ors_grpc.protocol import door
from ors_grpc.protocol.door import EnvNames, Metadata, error_reason, open_channel, retry_after

__all__ = ["EnvNames", "call_metadata", "error_reason", "open_channel", "retry_after"]


def call_metadata(request: web.Request, session_id: Optional[str] = None) -> Metadata:
    """The gRPC metadata of an HTTP request (`ors_grpc.protocol.door.call_metadata`)."""
    return door.call_metadata(request.headers, session_id)
