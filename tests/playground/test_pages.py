"""The playground's files over HTTP (no browser): served from the package with a strict
Content-Security-Policy, without an API key, and shipped in the wheel."""

from __future__ import annotations

import re
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest

from http_bridge._static import CONSTANTS_MODULE, CONTENT_SECURITY_POLICY, PLAYGROUND_DIR
from ors_grpc.protocol.constants import API_KEY_HEADER, SESSION_ID_HEADER
from tests.support.servers import ServeProcess
from tests.support.wheel import wheel_file_names

@pytest.fixture
async def http(keyed_server: ServeProcess) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=keyed_server.http_url) as session:
        yield session


async def test_the_page_and_its_files_need_no_key_and_carry_the_policy(http: aiohttp.ClientSession) -> None:
    async with http.get("/") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        page = await response.text()
    assert re.search(r"<script(?![^>]*\bsrc=)", page) is None, "no inline script (the policy forbids it)"
    # Drawn before any script runs: a clear loading state, not empty lists.
    assert '<select id="env" disabled><option value="">loading environments…</option></select>' in page
    assert '<select id="split" disabled><option value="">loading splits…</option></select>' in page
    assert '<button type="submit" id="start" disabled>' in page
    assert re.search(r"https?://", page) is None, "nothing from another host"
    modules = set()
    for name in sorted(path.name for path in PLAYGROUND_DIR.iterdir() if path.suffix in (".js", ".css")):
        async with http.get(f"/playground/{name}") as response:
            assert response.status == 200, name
            assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
            kind = "text/javascript" if name.endswith(".js") else "text/css"
            assert response.headers["Content-Type"] == f"{kind}; charset=utf-8"
            text = await response.text()
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text, name
        modules.update(re.findall(r'from "\./([a-z_]+\.js)"', text))
    async with http.get(f"/playground/{CONSTANTS_MODULE}") as response:  # written from ors_grpc.protocol.constants
        assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["Content-Type"] == "text/javascript; charset=utf-8"
        assert await response.text() == (f'export const API_KEY_HEADER = "{API_KEY_HEADER}";\n'
                                          f'export const SESSION_ID_HEADER = "{SESSION_ID_HEADER}";\n')
    # Every import is served.
    assert CONSTANTS_MODULE in modules and modules <= {path.name for path in PLAYGROUND_DIR.glob("*.js")} | {CONSTANTS_MODULE}
    async with http.get("/playground/index.html") as response:  # only the page's files, by name
        assert response.status == 404
    async with http.get("/server_stats") as response:  # the data still needs the key
        assert response.status == 401


def test_the_wheel_ships_the_pages(tmp_path: Path) -> None:
    names = wheel_file_names(tmp_path)
    shipped = {f"http_bridge/playground/{path.name}" for path in PLAYGROUND_DIR.iterdir() if path.is_file()}
    assert shipped and shipped <= names
    assert {"http_bridge/api_docs/index.html", "http_bridge/api_docs/init.js"} <= names
