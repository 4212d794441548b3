"""Security through both doors: the API key guards every route and RPC but
health; secrets never reach logs, errors or responses.

The key check compares with `hmac.compare_digest` (ors_grpc/server.py,
`_ApiKeyInterceptor`); constant time is a property of that function, which
a test on loopback cannot measure (docs/reliability.md). The API key at the
service level: tests/service/test_server.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from http_bridge.app import create_app
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from tests.support.reliability_environments import SECRET_NAME
from tests.support.reliability_helpers import PROBE_ENVIRONMENTS, grpc_call_request, serve_probe
from tests.support.servers import run_cli_logging_to

pytestmark = pytest.mark.timeout(120)

API_KEY = "k3y-7d1e0c9a-reliability"
SERVICE = pb.DESCRIPTOR.services_by_name["EnvironmentService"]
ROUTES = sorted(
    {(route.method, route.resource.canonical) for route in create_app("unused:1").router.routes()
     if route.method != "HEAD"}
)


# ----------------------------------------------------------------------------
# API key
# ----------------------------------------------------------------------------


#: Routes that need no key: /health (the spec), the API's description (as FastAPI serves it), and the
#: playground's page and files (the page asks for the key; every call it makes needs it).
PUBLIC_PATHS = {"/health", "/openapi.json", "/docs", "/docs/{name}", "/", "/playground/{name}"}
#: A real file behind each public route with a file name in its path.
PUBLIC_FILES = {"/docs/{name}": "/docs/init.js", "/playground/{name}": "/playground/app.js"}

# Well-formed bodies: a malformed one is a 422 from the bridge before any
# call reaches the service (where the key is checked).
CREATE_BODY = {"env_name": "probeenv", "task_spec": {}}
ROUTE_BODY = {"split": "train", "index": 0, "name": "echo_tag", "input": {}}


async def _http_status(http: aiohttp.ClientSession, method: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    body = CREATE_BODY if path == "/create" else ROUTE_BODY
    async with http.request(method, path, json=body, headers=headers, allow_redirects=False) as response:
        payload = await response.json() if response.content_type == "application/json" else None
        return response.status, payload


async def test_with_an_api_key_every_http_route_but_health_refuses_requests_without_it() -> None:
    paths = [(method, template.replace("{env}", "probeenv")) for method, template in ROUTES]
    paths.append(("GET", "/tools"))  # a bare path (default-environment redirect)
    with serve_probe("--api-key", API_KEY) as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http:
            for method, path in paths:
                for headers in ({"X-Session-ID": "s"}, {"X-Session-ID": "s", "X-API-Key": API_KEY + "x"},
                                {"X-Session-ID": "s", "Authorization": "Bearer wrong"}):
                    status, payload = await _http_status(http, method, PUBLIC_FILES.get(path, path), headers)
                    if path in PUBLIC_PATHS:
                        assert status == 200
                    else:
                        assert status == 401 and payload["detail"], (method, path, headers)
                        assert API_KEY not in json.dumps(payload)
                for headers in ({"X-Session-ID": "s", "X-API-Key": API_KEY},
                                {"X-Session-ID": "s", "Authorization": f"Bearer {API_KEY}"}):
                    status, _ = await _http_status(http, method, PUBLIC_FILES.get(path, path), headers)
                    assert status != 401, (method, path)


def _rpc(channel: grpc.Channel, method: Any) -> Any:
    path = f"/{SERVICE.full_name}/{method.name}"
    if method.server_streaming:
        stream = channel.unary_stream(path)
        return lambda metadata: list(stream(b"", metadata=metadata, timeout=30))
    unary = channel.unary_unary(path)
    return lambda metadata: unary(b"", metadata=metadata, timeout=30)


def _code(call: Any, metadata: tuple) -> grpc.StatusCode:
    try:
        call(metadata)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_with_an_api_key_every_rpc_but_health_refuses_calls_without_it() -> None:
    with serve_probe("--api-key", API_KEY) as serve, grpc.insecure_channel(serve.grpc_target) as channel:
        for method in SERVICE.methods:
            call = _rpc(channel, method)
            for metadata in [(), (("x-api-key", "wrong"),), (("x-api-key", API_KEY.upper()),)]:
                expected = grpc.StatusCode.OK if method.name == "Health" else grpc.StatusCode.UNAUTHENTICATED
                assert _code(call, metadata) == expected, method.name
            if method.name != "Drain":  # with the key it would drain the server (tests/service/test_drain.py)
                assert _code(call, (("x-api-key", API_KEY),)) != grpc.StatusCode.UNAUTHENTICATED, method.name
        # The standard health service answers without a key; reflection does not.
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            list(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


# ----------------------------------------------------------------------------
# Secrets
# ----------------------------------------------------------------------------

SECRET = "s3cr3t-9f8e7d6c5b4a-never-shown"


@contextlib.contextmanager
def serve_logging_everything(log: Path) -> Iterator[tuple[str, str]]:
    """`ors-grpc --log-level DEBUG serve` with stdout and stderr both in `log`;
    yields (grpc target, http url)."""
    with run_cli_logging_to(log, "serve", *PROBE_ENVIRONMENTS, "--port", "0", "--http-port", "0") as doors:
        yield doors["gRPC"], f"http://{doors['HTTP']}"


class Transcript:
    """Everything the clients were told: statuses, headers, bodies, gRPC details."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    async def http(self, response: aiohttp.ClientResponse) -> str:
        text = await response.text()
        self.parts += [str(response.status), json.dumps(dict(response.headers)), text]
        return text

    def grpc_error(self, error: grpc.aio.AioRpcError) -> None:
        self.parts += [error.code().name, error.details() or "", repr(error.trailing_metadata())]

    def grpc_message(self, message: Any) -> None:
        self.parts.append(str(message))


async def _http_episodes(http: aiohttp.ClientSession, said: Transcript) -> None:
    header = base64.b64encode(json.dumps({SECRET_NAME: {"value": SECRET}}).encode()).decode()
    create = [
        ("h-header", {"env_name": "probeenv", "task_spec": {"tag": "h"}}, {"X-Secrets": header}),
        ("h-body", {"env_name": "probeenv", "task_spec": {"tag": "b"}, "secrets": {SECRET_NAME: SECRET}}, {}),
        ("h-leaky", {"env_name": "leakysetupenv", "task_spec": {"tag": "l"}, "secrets": {SECRET_NAME: SECRET}}, {}),
        ("h-prompt", {"env_name": "leakypromptenv", "task_spec": {"tag": "p"}, "secrets": {SECRET_NAME: SECRET}}, {}),
        # Malformed bodies that carry the secret: the 422 must not echo it.
        ("h-bad-1", {"task_spec": {}, "index": "x", "secrets": {SECRET_NAME: SECRET}}, {}),
        ("h-bad-2", {"task_spec": {}, "secrets": {SECRET_NAME: [SECRET]}}, {}),
        ("h-bad-3", {"task_spec": {}}, {"X-Secrets": base64.b64encode(json.dumps({SECRET_NAME: [SECRET]}).encode()).decode()}),
    ]
    for sid, body, headers in create:
        async with http.post("/create", json=body, headers={"X-Session-ID": sid, **headers}) as response:
            await said.http(response)
    for sid in ("h-header", "h-body", "h-leaky", "h-prompt"):
        for name in ("leak", "echo_tag"):
            body = {"name": name, "input": {}}
            async with http.post("/probeenv/call", json=body, headers={"X-Session-ID": sid}) as response:
                await said.http(response)
        for path in ("/probeenv/prompt", "/probeenv/task_tools"):
            async with http.get(path, headers={"X-Session-ID": sid}) as response:
                await said.http(response)
        async with http.post("/delete", headers={"X-Session-ID": sid}) as response:
            await said.http(response)


async def _grpc_episodes(target: str, said: Transcript) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        for sid, env_name in (("g-probe", "probeenv"), ("g-leaky", "leakysetupenv"), ("g-prompt", "leakypromptenv")):
            request = pb.CreateEpisodeRequest(session_id=sid, env_name=env_name, secrets={SECRET_NAME: SECRET})
            request.task_spec.json = json.dumps({"tag": sid})
            said.grpc_message(await stub.CreateEpisode(request))
            for call in (stub.CallTool(grpc_call_request(sid, "leak")), stub.GetPrompt(pb.GetPromptRequest(session_id=sid)),
                         stub.ListTaskTools(pb.ListTaskToolsRequest(session_id=sid))):
                try:
                    if hasattr(call, "__aiter__"):
                        [said.grpc_message(event) async for event in call]
                    else:
                        said.grpc_message(await call)
                except grpc.aio.AioRpcError as error:
                    said.grpc_error(error)
            said.grpc_message(await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid)))


async def test_secrets_never_appear_in_logs_errors_or_responses(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    said = Transcript()
    with serve_logging_everything(log) as (grpc_target, http_url):
        async with aiohttp.ClientSession(base_url=http_url) as http:
            await _http_episodes(http, said)
        await _grpc_episodes(grpc_target, said)
    logged = log.read_text()
    told = "\n".join(said.parts)
    # The errors did happen and were logged and answered (masked) ...
    assert "tool_failed" in logged and "setup_failed" in logged and "level=DEBUG" in logged
    assert "tool failed with token ***" in told and "cannot log in with token ***" in told
    assert "RuntimeError: no prompt for token ***" in told and "no tools for token ***" in told
    assert told.count("422") >= 3
    # ... and the secret is nowhere.
    for text, where in ((logged, "the server's output"), (told, "the responses")):
        assert SECRET not in text, where
        assert not re.search(re.escape(SECRET[:12]), text), where
