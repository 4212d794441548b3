"""The bridge's own pages: the playground at `/` and Swagger UI at `/docs`, every file served from here.

The playground (`http_bridge/playground/`: plain HTML, CSS and JavaScript
modules, and `constants.js`, the header names of `ors_grpc.protocol.constants`
written out for them) plays episodes through the standard ORS routes and polls
`/server_stats`; `/docs` is Swagger UI from the `swagger-ui-bundle-v2`
wheel (its `swagger_ui_bundle` package) on `/openapi.json`. Nothing is
loaded from another host, so both work offline, and every answer carries a
Content-Security-Policy that allows no other: scripts and styles from this
origin only (no inline ones), images from here or `data:` (tool outputs),
requests to this origin only, no frames, no forms posted anywhere.

Like `/openapi.json`, these files need no API key and never reach the
backend: they hold no data (the playground asks for the key, which the
page keeps in memory).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from aiohttp import web
from swagger_ui_bundle import swagger_ui_path

from ors_grpc.protocol.constants import API_KEY_HEADER, SESSION_ID_HEADER

__all__ = ["CONSTANTS_MODULE", "CONTENT_SECURITY_POLICY", "PLAYGROUND_FILES", "routes"]

PLAYGROUND_DIR = Path(__file__).with_name("playground")
API_DOCS_DIR = Path(__file__).with_name("api_docs")
SWAGGER_UI_DIR = Path(str(swagger_ui_path))

CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
))

_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidated each time (ETag / Last-Modified): an upgraded server serves its new files.
    "Cache-Control": "no-cache",
}
_CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}

#: The playground's files by name (fixed when the module loads: no path from a request reaches the disk).
PLAYGROUND_FILES = {
    path.name: path for path in sorted(PLAYGROUND_DIR.iterdir())
    if re.fullmatch(r"[a-z_]+\.(js|css)", path.name)
}
#: The module the playground's scripts import the protocol's header names from (one spelling).
CONSTANTS_MODULE = "constants.js"
_CONSTANTS_JS = "".join(
    f"export const {name} = {json.dumps(value)};\n"
    for name, value in (("API_KEY_HEADER", API_KEY_HEADER), ("SESSION_ID_HEADER", SESSION_ID_HEADER))
)
#: What `/docs/{name}` serves: Swagger UI's two files and our initializer.
DOCS_FILES = {
    "swagger-ui.css": SWAGGER_UI_DIR / "swagger-ui.css",
    "swagger-ui-bundle.js": SWAGGER_UI_DIR / "swagger-ui-bundle.js",
    "init.js": API_DOCS_DIR / "init.js",
}


def _file(path: Path) -> web.FileResponse:
    headers = {**_HEADERS, "Content-Type": f"{_CONTENT_TYPES[path.suffix]}; charset=utf-8"}
    return web.FileResponse(path, headers=headers)


def _one_of(files: dict[str, Path], name: str) -> web.FileResponse:
    path = files.get(name)
    if path is None:
        raise web.HTTPNotFound(reason="Not Found")
    return _file(path)


async def playground_page(request: web.Request) -> web.FileResponse:
    return _file(PLAYGROUND_DIR / "index.html")


async def playground_file(request: web.Request) -> web.StreamResponse:
    if request.match_info["name"] == CONSTANTS_MODULE:
        return web.Response(text=_CONSTANTS_JS, content_type="text/javascript", charset="utf-8", headers=_HEADERS)
    return _one_of(PLAYGROUND_FILES, request.match_info["name"])


async def docs_page(request: web.Request) -> web.FileResponse:
    return _file(API_DOCS_DIR / "index.html")


async def docs_file(request: web.Request) -> web.FileResponse:
    return _one_of(DOCS_FILES, request.match_info["name"])


def routes() -> list[web.RouteDef]:
    """`/`, `/playground/{name}`, `/docs`, `/docs/{name}`, for the app's route table."""
    return [
        web.get("/", playground_page),
        web.get("/playground/{name}", playground_file),
        web.get("/docs", docs_page),
        web.get("/docs/{name}", docs_file),
    ]
