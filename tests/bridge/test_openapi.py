"""`/openapi.json` and `/docs` (Swagger UI, served offline): the document is valid OpenAPI 3.1, names exactly the routes the
bridge serves, and describes what a real server answers."""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from http_bridge import create_app
from http_bridge._openapi import openapi_document
from http_bridge._static import CONTENT_SECURITY_POLICY
from http_bridge.app import ROOT_SEGMENTS
from tests.support.bridge_http import parse_sse
from tests.support.keyed_server import API_KEY, http, serve  # noqa: F401 (fixtures: a server with an API key)

KEY = {"X-API-Key": API_KEY}


def served_operations() -> set[tuple[str, str]]:
    """(method, path template) of every route the aiohttp app serves.

    aiohttp adds a HEAD route beside each GET one; it is not an operation of its own."""
    app = create_app("127.0.0.1:1")
    routes = {(route.method.lower(), route.resource.canonical) for route in app.router.routes()}
    for method, path in routes:
        if method == "head":
            assert ("get", path) in routes, f"HEAD {path} without GET"
    return {(method, path) for method, path in routes if method != "head"}


def documented_operations() -> set[tuple[str, str]]:
    return {(method, path) for path, item in openapi_document()["paths"].items() for method in item}


def test_every_served_route_is_documented_and_every_documented_route_is_served() -> None:
    served, documented = served_operations(), documented_operations()
    assert served - documented == set(), "served but not in http_bridge/_openapi.py OPERATIONS"
    assert documented - served == set(), "in http_bridge/_openapi.py OPERATIONS but not served"
    assert len(served) >= 21  # the introspection found the routes


def test_every_root_route_is_exempt_from_the_default_environment_redirect() -> None:
    roots = {path.strip("/").split("/")[0] for _, path in served_operations() if not path.startswith("/{env}")}
    assert roots - ROOT_SEGMENTS == set()


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi_document()
    assert document["openapi"].startswith("3.1")
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema
    # The served text is the same document.
    assert json.loads(json.dumps(document)) == document


def test_sse_routes_document_their_event_stream() -> None:
    paths = openapi_document()["paths"]
    call = paths["/{env}/call"]["post"]["responses"]["200"]["content"]
    assert list(call) == ["text/event-stream"]
    assert set(call["text/event-stream"]["x-sse-events"]) == {"task_id", "chunk", "end", "error"}
    assert "4096" in paths["/{env}/call"]["post"]["description"]
    create_session = paths["/create_session"]["post"]["responses"]["200"]["content"]
    assert set(create_session) == {"application/json", "text/event-stream"}


# ----------------------------------------------------------------------------
# Against a real server (with an API key: the description routes need none)
# ----------------------------------------------------------------------------


async def test_openapi_json_and_docs_need_no_key(http: aiohttp.ClientSession) -> None:
    async with http.get("/openapi.json") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("application/json")
        assert await response.json() == openapi_document()
    async with http.get("/docs") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/html")
        assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        page = await response.text()
    # Every file of the page comes from the bridge itself (no CDN), without a key.
    files = re.findall(r'(?:src|href)="(/docs/[^"]+)"', page)
    assert sorted(files) == ["/docs/init.js", "/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css"]
    for path in files:
        async with http.get(path) as response:
            assert response.status == 200, path
            assert response.headers["Content-Type"].split(";")[0] in ("text/javascript", "text/css")
            assert len(await response.read()) > 100
    async with http.get("/docs/index.j2") as response:  # in the Swagger UI folder, but not served
        assert response.status == 404
    async with http.get("/list_environments") as response:
        assert response.status == 401


def check(method: str, path: str, status: int, value: Any, media_type: str = "application/json") -> None:
    """`value` fits the schema the document gives for this answer."""
    response = openapi_document()["paths"][path][method]["responses"][str(status)]
    if "$ref" in response:  # #/components/responses/...
        response = openapi_document()["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    schema = response["content"][media_type]["schema"]
    validator = OAS31Validator({**schema, "components": openapi_document()["components"]})
    errors = [error.message for error in validator.iter_errors(value)]
    assert errors == [], f"{method.upper()} {path} {status}: {errors}"


def check_body(model: str, body: dict) -> None:
    validator = OAS31Validator({"$ref": f"#/components/schemas/{model}", "components": openapi_document()["components"]})
    assert list(validator.iter_errors(body)) == []


async def test_a_whole_episode_answers_as_documented(http: aiohttp.ClientSession) -> None:
    async def get(path: str, template: str, **headers: str) -> Any:
        async with http.get(path, headers={**KEY, **headers}) as response:
            check("get", template, response.status, await response.json())
            return await response.json()

    async def post(path: str, template: str, body: Any = None, **headers: str) -> Any:
        async with http.post(path, json=body, headers={**KEY, **headers}) as response:
            check("post", template, response.status, await response.json())
            return await response.json()

    await get("/health", "/health")
    await get("/version", "/version")
    await get("/list_environments", "/list_environments")
    await get("/echoenv/tools", "/{env}/tools")
    await get("/echoenv/splits", "/{env}/splits")
    await get("/nosuchenv/tools", "/{env}/tools")  # 404 {"detail"}
    for path in ("/echoenv/tasks", "/echoenv/num_tasks"):
        check_body("SplitBody", {"split": "train"})
        await post(path, "/{env}" + path.removeprefix("/echoenv"), {"split": "train"})
    await post("/echoenv/task", "/{env}/task", {"split": "train", "index": 0})
    await post("/echoenv/task", "/{env}/task", {"split": "train", "index": "x"})  # 422
    await post("/echoenv/task", "/{env}/task", {"split": "nope", "index": 0})  # 400
    await post("/echoenv/get_task_range", "/{env}/get_task_range", {"split": "train", "start": 0, "stop": 1})

    sid = (await post("/create_session", "/create_session"))["sid"]
    async with http.post("/create_session", headers={**KEY, "Accept": "text/event-stream"}) as response:
        stream = parse_sse(await response.text())
    assert stream.names() == ["task_id", "end"]
    check_body("CreateBody", {"split": "train", "index": 0})
    await post("/create", "/create", {"split": "train", "index": 0}, **{"X-Session-ID": sid})
    await get("/echoenv/prompt", "/{env}/prompt", **{"X-Session-ID": sid})
    await get("/echoenv/task_tools", "/{env}/task_tools", **{"X-Session-ID": sid})
    for body in ({"name": "echo", "input": {"text": "hi"}}, {"name": "nosuchtool", "input": {}}):
        check_body("CallBody", body)
        async with http.post("/echoenv/call", json=body, headers={**KEY, "X-Session-ID": sid}) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            stream = parse_sse(await response.text())
        assert stream.names()[0] == "task_id"
        run_tool_output = openapi_document()["paths"]["/{env}/call"]["post"]["responses"]["200"]["content"][
            "text/event-stream"]["x-sse-events"]["end"]["contentSchema"]
        validator = OAS31Validator({**run_tool_output, "components": openapi_document()["components"]})
        assert list(validator.iter_errors(stream.result())) == []
    stats = await get("/server_stats", "/server_stats")
    assert {row["env_name"]: row["open_sessions"] for row in stats["environments"]}["echoenv"] == 1
    await post("/ping", "/ping", **{"X-Session-ID": sid})
    await post("/ping", "/ping")  # 400 without the header
    await post("/delete", "/delete", **{"X-Session-ID": sid})
    await post("/ping", "/ping", **{"X-Session-ID": sid})  # 404 now
    await post("/delete_session", "/delete_session", **{"X-Session-ID": sid})
