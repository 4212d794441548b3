"""The HTTP door's Host and Origin checks and CORS answers, before every route
(the ORS API, the playground and its files, /docs, /openapi.json): the rule
is `ors_grpc.protocol.browser_policy`'s, shared with the MCP door.

On the path of every request: a request without `Origin` (every client but a
browser) costs a `Host` lookup in two sets. CORS headers are added only when
some origin is allowed (`on_response_prepare`, so that a streamed answer,
prepared by its handler, has them too).
"""

from __future__ import annotations

import logging
from typing import Optional

from aiohttp import web

from ors_grpc.protocol.browser_policy import (
    FOREIGN_HOST_DETAIL,
    FOREIGN_ORIGIN_DETAIL,
    READ_ONLY_METHODS,
    BrowserPolicy,
    OriginKind,
    is_preflight,
)

from . import _convert as convert

__all__ = ["browser_refusal", "install_cors"]

logger = logging.getLogger("http_bridge")

#: The request's allowed cross origin, for its answer's CORS headers.
_CORS_ORIGIN = "ors_cors_origin"


def _refuse(status: int, detail: str, error: str) -> web.Response:
    logger.warning("http_client_error status=%d error=%s", status, error)
    return web.Response(status=status, text=convert.dumps({"detail": detail}), content_type="application/json")


def browser_refusal(policy: BrowserPolicy, request: web.Request) -> Optional[web.Response]:
    """The answer `policy` gives `request` before its route, if any: 421 for
    a foreign `Host`, 403 for a foreign `Origin` on a method that can change
    state (or its preflight), 204 with CORS headers for an allowed origin's
    preflight. None: the request goes on (an allowed origin noted for its
    answer's CORS headers)."""
    headers = request.headers
    host = headers.get("Host")
    if not policy.host_allowed(host):
        return _refuse(421, FOREIGN_HOST_DETAIL, "foreign_host")
    origin = headers.get("Origin")
    if origin is None:
        return None
    kind = policy.origin_kind(origin, host)
    if is_preflight(request.method, headers):
        if kind is OriginKind.FOREIGN:
            return _refuse(403, FOREIGN_ORIGIN_DETAIL, "foreign_origin")
        return web.Response(status=204, headers=policy.preflight_headers(origin))
    if kind is OriginKind.FOREIGN and request.method not in READ_ONLY_METHODS:
        return _refuse(403, FOREIGN_ORIGIN_DETAIL, "foreign_origin")
    if kind is OriginKind.ALLOWED:
        request[_CORS_ORIGIN] = origin
    return None


async def _add_cors_headers(request: web.BaseRequest, response: web.StreamResponse) -> None:
    origin = request.get(_CORS_ORIGIN)
    if origin is None:
        return
    for name, value in BrowserPolicy.cors_headers(origin).items():
        if name == "Vary" and response.headers.get("Vary"):
            value = f"{response.headers['Vary']}, {value}"
        response.headers[name] = value


def install_cors(app: web.Application, policy: BrowserPolicy) -> None:
    """Answers to allowed pages get their CORS headers; nothing is added
    (and nothing runs) when no origin is allowed."""
    if policy.allows_cross_origin:
        app.on_response_prepare.append(_add_cors_headers)
