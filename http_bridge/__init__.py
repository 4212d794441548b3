"""The standard ORS HTTP/SSE API, served by a thin aiohttp bridge onto the ORS gRPC service."""

from .app import HttpLimits, create_app, start_bridge

__all__ = ["HttpLimits", "create_app", "start_bridge"]
