"""Hardening found by testing from outside, on both HTTP doors
(`serve --http-port`, whose bridge calls the service in process, and
`ors-grpc bridge` over a real channel) and on gRPC:

- text that cannot become protobuf (lone surrogates, non-UTF-8 header bytes)
  is a 400 with a detail on every route, never a 500;
- aiohttp's own refusals (header too long, bad method, malformed head) are
  JSON `{"detail"}` with at most one WARNING line and no traceback; `X-Secrets`
  up to 64 KiB is accepted; a secret sent every way never reaches a log line
  (at DEBUG) nor an error text;
- stalled connections are closed within the configured timeouts while
  /health answers; connections over the cap get 503;
- one message limit for both HTTP doors; answers over it fail with
  RESOURCE_EXHAUSTED and ERROR_REASON_MESSAGE_TOO_LARGE, no traceback;
- the environment's code raising outside a tool is ERROR_REASON_ENVIRONMENT_ERROR;
- a request's session_id and x-session-id metadata must agree;
- every error also comes as a google.rpc.Status with an ErrorInfo.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from http_bridge.app import create_app
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc._generated.ors.v1 import types_pb2 as pb_types
from ors_grpc.protocol.constants import ERROR_REASON_METADATA_KEY, STATUS_DETAILS_METADATA_KEY
from ors_grpc.protocol.errors import ERROR_DOMAIN
from tests.support.reliability_environments import SECRET_NAME
from tests.support.reliability_helpers import PROBE_ENVIRONMENTS, Door, Doors, both_doors

pytestmark = pytest.mark.timeout(300)

ENVIRONMENTS = (*PROBE_ENVIRONMENTS, "tests.support.reliability_environments:SizesEnv")
ROUTES = sorted(
    {(route.method, route.resource.canonical) for route in create_app("unused:1").router.routes()
     if route.method != "HEAD"}
)
SECRET = "s3cr3t-7c1f-hardening-never-logged"
DEFAULT_LIMIT = 32 * 1024 * 1024


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    with both_doors(tmp_path_factory.mktemp("doors"), ENVIRONMENTS) as running:
        yield running


# ----------------------------------------------------------------------------
# HTTP helpers
# ----------------------------------------------------------------------------


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def http_request(url: str, method: str, path: str, body: bytes = b"",
                 headers: dict[str, str | bytes] | None = None) -> tuple[int, bytes, dict[str, str]]:
    """One request; header values may be raw bytes."""
    connection = http.client.HTTPConnection(*_address(url), timeout=60)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


def raw_exchange(url: str, data: bytes) -> bytes:
    """Send `data` as is; everything the server answers until it closes."""
    with socket.create_connection(_address(url), timeout=60) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def _json_answer(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    assert headers.get("content-type", "").startswith("application/json"), raw[:300]
    return int(lines[0].split()[1]), headers, json.loads(body)


def _assert_client_error(status: int, body: bytes, where: str) -> str:
    assert 400 <= status < 500, (where, status, body[:300])
    detail = json.loads(body)["detail"]
    assert isinstance(detail, str) and detail, where
    return detail


def _new_log(door: Door, since: int) -> str:
    return door.log.read_bytes()[since:].decode("utf-8", "replace")


def _path(template: str) -> str:
    return template.replace("{env}", "probeenv")


# ----------------------------------------------------------------------------
# Unencodable text
# ----------------------------------------------------------------------------

LONE = "\ud800"
#: Every field any route reads, each with a lone surrogate (JSON `"\ud800"`).
SURROGATE_BODY = json.dumps({
    "split": LONE, "index": 0, "name": LONE, "input": {LONE: LONE}, "task_id": LONE,
    "env_name": LONE, "task_spec": {"k": LONE}, "secrets": {"K": LONE}, "start": 0, "stop": 1,
}).encode()


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
def test_unencodable_text_is_a_400_with_a_detail_on_every_route(doors: Doors, door_index: int) -> None:
    door = doors.http[door_index]
    bad_secrets = base64.b64encode(json.dumps({SECRET_NAME: LONE}).encode()).decode()
    for method, template in ROUTES:
        path = _path(template)
        where = f"{door.name} {method} {path}"
        # Not UTF-8 header bytes: refused before any route reads them.
        status, body, _ = http_request(door.http_url, method, path, SURROGATE_BODY,
                                       {"X-Session-ID": b"\xff\xfe-sid"})
        assert status == 400, (where, status, body)
        _assert_client_error(status, body, where)
        status, body, _ = http_request(door.http_url, method, path, SURROGATE_BODY,
                                       {"X-Session-ID": "sid", "X-Anything": b"caf\xe9"})
        assert status == 400, (where, status, body)
        # Lone surrogates in the body, in X-Secrets, in the path.
        reads_body = _reads_a_body(door.http_url, method, path)
        for headers, route_path in (({"X-Session-ID": "sid"}, path),
                                    ({"X-Session-ID": "sid", "X-Secrets": bad_secrets}, path),
                                    ({"X-Session-ID": "sid"}, path.replace("probeenv", "%ED%A0%80"))):
            status, body, _ = http_request(door.http_url, method, route_path, SURROGATE_BODY, headers)
            if status >= 400:
                _assert_client_error(status, body, f"{where} {headers} {route_path}")
            if reads_body and route_path == path:
                # Every route that reads a body refuses it.
                assert status == 400, (where, status, body)


def _reads_a_body(url: str, method: str, path: str) -> bool:
    """Whether the route reads a JSON body: it refuses an empty one."""
    status, body, _ = http_request(url, method, path, b"", {"X-Session-ID": "sid"})
    return status == 422 and json.loads(body)["detail"].startswith("Request body is required")


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
def test_the_issues_examples_are_400(doors: Doors, door_index: int) -> None:
    url = doors.http[door_index].http_url
    status, body, _ = http_request(url, "POST", "/probeenv/num_tasks", b'{"split":"\\ud800"}')
    assert status == 400 and "UTF-8" in json.loads(body)["detail"], body
    status, body, _ = http_request(url, "POST", "/ping", b"", {"X-Session-ID": b"\xc3\x28"})
    assert status == 400 and "X-Session-ID" in json.loads(body)["detail"], body


# ----------------------------------------------------------------------------
# aiohttp's own refusals, and secrets in logs
# ----------------------------------------------------------------------------


def _malformed_heads(marker: bytes) -> dict[str, bytes]:
    """Request heads aiohttp refuses itself; each carries `marker`."""
    return {
        "header too long": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Secrets: " + marker * (200_000 // len(marker))
                           + b"\r\n\r\n",
        "bad method": b"G\x01T /" + marker + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "header without a colon": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Secrets " + marker + b"\r\n\r\n",
        "TLS to the HTTP port": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + marker + b"\r\n\r\n",
        "bad version": b"GET /health HTTP/9." + marker + b"\r\n\r\n",
        "bad content length": b"POST /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + marker + b"\r\n\r\n",
    }


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
def test_aiohttps_own_client_errors_are_json_with_one_warning_and_no_request_bytes(
    doors: Doors, door_index: int
) -> None:
    door = doors.http[door_index]
    marker = SECRET.encode()
    since = door.log.stat().st_size
    heads = _malformed_heads(marker)
    for kind, head in heads.items():
        status, headers, body = _json_answer(raw_exchange(door.http_url, head))
        assert 400 <= status < 500 and body["detail"], (kind, status, body)
        assert SECRET not in json.dumps(body) and SECRET[:10] not in json.dumps(body), (kind, body)
    # Heads too large or malformed on every route, too.
    sent = len(heads)
    for method, template in ROUTES:
        path = _path(template).encode()
        for head in (method.encode() + b" " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Secrets: " + marker * 8_000 + b"\r\n\r\n",
                     method.encode() + b" " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Secrets " + marker + b"\r\n\r\n"):
            status, _, body = _json_answer(raw_exchange(door.http_url, head))
            assert status == 400 and body["detail"] and SECRET[:10] not in body["detail"], (method, path, body)
            sent += 1
    assert http_request(door.http_url, "GET", "/health")[0] == 200
    logged = _new_log(door, since)
    warnings = [line for line in logged.splitlines() if "level=WARNING" in line]
    assert len(warnings) <= sent, warnings
    assert "level=ERROR" not in logged and "Traceback" not in logged, logged[-3000:]
    assert SECRET[:10] not in logged


def _secrets_header(secrets: dict[str, str]) -> str:
    return base64.b64encode(json.dumps({name: {"value": value} for name, value in secrets.items()}).encode()).decode()


def test_x_secrets_of_60_kib_is_accepted_and_a_secret_sent_every_way_is_never_logged(tmp_path: Path) -> None:
    padding = {f"KEY_{n}": "k" * 1_000 for n in range(60)}  # a 60 KiB secrets JSON
    big = _secrets_header({SECRET_NAME: SECRET, **padding})
    assert len(big) > 64 * 1024
    small = _secrets_header({SECRET_NAME: SECRET})
    told: list[str] = []
    with both_doors(tmp_path, ENVIRONMENTS) as running:
        for door in running.http:
            ways = [({"X-Secrets": small}, {}), ({"X-Secrets": big}, {}), ({}, {"secrets": {SECRET_NAME: SECRET}})]
            for number, (headers, body_secrets) in enumerate(ways):
                sid = f"{door.name[:5]}-{number}"
                body = json.dumps({"env_name": "probeenv", "task_spec": {"tag": sid}, **body_secrets}).encode()
                status, answer, _ = http_request(door.http_url, "POST", "/create", body, {"X-Session-ID": sid, **headers})
                assert status == 200, (door.name, number, answer)
                # The tool's error carries the secret: it arrives masked, so the environment had it.
                status, answer, _ = http_request(door.http_url, "POST", "/probeenv/call",
                                                 b'{"name": "leak", "input": {}}', {"X-Session-ID": sid})
                assert status == 200 and b"tool failed with token ***" in answer, answer
                told.append(answer.decode())
                told.append(http_request(door.http_url, "POST", "/delete", b"", {"X-Session-ID": sid})[1].decode())
            # Too large even now (over 128 KiB): refused, without its bytes.
            huge = _secrets_header({SECRET_NAME: SECRET, **{f"KEY_{n}": "k" * 1_000 for n in range(200)}})
            status, answer, _ = http_request(door.http_url, "POST", "/create", b"{}",
                                             {"X-Session-ID": "huge", "X-Secrets": huge})
            assert status == 400, answer
            told.append(answer.decode())
            for head in _malformed_heads(SECRET.encode()).values():
                told.append(raw_exchange(door.http_url, head).decode("latin-1"))
        with grpc.insecure_channel(running.grpc_target) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            request = pb.CreateEpisodeRequest(session_id="grpc-1", env_name="probeenv", secrets={SECRET_NAME: SECRET})
            request.task_spec.json = "{}"
            stub.CreateEpisode(request, timeout=30)
            call = pb.CallToolRequest(session_id="grpc-1")
            call.call.name, call.call.input.json = "leak", "{}"
            events = list(stub.CallTool(call, timeout=30))
            assert events[-1].failure.message == "tool failed with token ***"
            stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id="grpc-1"), timeout=30)
    for door in running.http:
        logged = door.log.read_text(errors="replace")
        assert "level=DEBUG" in logged
        assert SECRET not in logged and SECRET[:10] not in logged, door.name
    text = "\n".join(told)
    assert SECRET not in text and SECRET[:10] not in text


# ----------------------------------------------------------------------------
# Stalled connections, connection cap
# ----------------------------------------------------------------------------

STALLED = 20


def _stall(url: str, data: bytes) -> socket.socket:
    sock = socket.create_connection(_address(url), timeout=60)
    sock.sendall(data)
    return sock


def _closed_after(sock: socket.socket) -> tuple[float, bytes]:
    """Seconds until the server closed `sock`, and what it sent."""
    started = time.monotonic()
    received = b""
    with sock:
        while chunk := sock.recv(65536):
            received += chunk
    return time.monotonic() - started, received


def test_stalled_connections_are_closed_within_the_timeouts_and_health_keeps_answering(tmp_path: Path) -> None:
    with both_doors(tmp_path, ENVIRONMENTS, "--http-header-timeout", "2", "--http-body-timeout", "2") as running:
        for door in running.http:
            heads = [_stall(door.http_url, b"POST /create HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Sess") for _ in range(STALLED)]
            bodies = [_stall(door.http_url, b"POST /create HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Session-ID: s\r\n"
                                            b"Content-Length: 1000\r\n\r\n{\"env") for _ in range(STALLED)]
            idle = [_stall(door.http_url, b"") for _ in range(STALLED)]
            status, body, _ = http_request(door.http_url, "GET", "/health")
            assert (status, json.loads(body)) == (200, {"status": "ok"}), door.name
            slowest = 0.0
            for sock in heads + idle:
                seconds, received = _closed_after(sock)
                # The configured 2 s, plus aiohttp's rounding of timers; generous for a busy machine.
                assert seconds < 30 and received == b"", (door.name, seconds, received)
                slowest = max(slowest, seconds)
            for sock in bodies:
                seconds, received = _closed_after(sock)
                assert seconds < 30, (door.name, seconds)
                status, _, answer = _json_answer(received)
                assert status == 408 and answer["detail"], received
            assert http_request(door.http_url, "GET", "/health")[0] == 200
            print(f"\n[figure] {door.name}: {3 * STALLED} stalled connections closed, the last {slowest:.1f} s "
                  "after /health answered")


def test_connections_over_the_cap_are_answered_503_and_health_answers_after(tmp_path: Path) -> None:
    cap = 10
    with both_doors(tmp_path, ENVIRONMENTS, "--http-max-connections", str(cap)) as running:
        for door in running.http:
            held = [_stall(door.http_url, b"") for _ in range(cap)]
            time.sleep(0.5)  # accepted by the server
            status, headers, body = _json_answer(raw_exchange(door.http_url, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
            assert status == 503 and headers["retry-after"] == "1" and body["detail"], (door.name, status, body)
            for sock in held:
                sock.close()
            deadline = time.monotonic() + 20
            while http_request_or_none(door.http_url) != 200:
                assert time.monotonic() < deadline, door.name
                time.sleep(0.1)


def http_request_or_none(url: str) -> int | None:
    try:
        return http_request(url, "GET", "/health")[0]
    except (OSError, http.client.HTTPException):
        return None


# ----------------------------------------------------------------------------
# Message limit: one for both doors
# ----------------------------------------------------------------------------

RESULT_BYTES = 34_000_000


def _sse_events(body: bytes) -> list[tuple[str, str]]:
    events, name = [], None
    for line in body.decode().split("\n"):
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: ") and name is not None:
            events.append((name, line.removeprefix("data: ")))
            name = None
    return events


def _sized_episode(url: str, sid: str, prompt_bytes: int = 1) -> None:
    body = json.dumps({"env_name": "sizesenv", "task_spec": {"tag": sid, "prompt_bytes": prompt_bytes}}).encode()
    assert http_request(url, "POST", "/create", body, {"X-Session-ID": sid})[0] == 200


def _call_for_a_34_mb_result(door: Door) -> tuple[int, bytes, list[tuple[str, str]]]:
    """A new episode on `door` and its `blob` tool called for RESULT_BYTES: the status, body and SSE events."""
    sid = f"big-{door.name[:5]}"
    _sized_episode(door.http_url, sid)
    status, body, _ = http_request(door.http_url, "POST", "/sizesenv/call",
                                   json.dumps({"name": "blob", "input": {"size": RESULT_BYTES}}).encode(),
                                   {"X-Session-ID": sid})
    return status, body, _sse_events(body)


def test_a_34_mb_result_fails_the_same_on_both_doors_under_the_default_limit(doors: Doors) -> None:
    outcomes = []
    for door in doors.http:
        since = door.log.stat().st_size
        status, body, events = _call_for_a_34_mb_result(door)
        assert status == 200 and [name for name, _ in events] == ["task_id", "error"], (door.name, body[:300])
        outcomes.append(events[1][1])
        # An answer too large for a prompt too: a 500 with the reason's detail.
        prompt_sid = f"bigp-{door.name[:5]}"
        _sized_episode(door.http_url, prompt_sid, prompt_bytes=RESULT_BYTES)
        status, body, _ = http_request(door.http_url, "GET", "/sizesenv/prompt", b"", {"X-Session-ID": prompt_sid})
        assert status == 500 and "over the server's message limit" in json.loads(body)["detail"], body[:300]
        assert "Traceback" not in _new_log(door, since)
    assert outcomes[0] == outcomes[1] and "over the server's message limit of 33554432 bytes" in outcomes[0]
    assert "Traceback" not in doors.http[0].log.read_text()


def test_a_34_mb_result_is_delivered_the_same_on_both_doors_with_a_raised_limit(tmp_path: Path) -> None:
    limit = str(64 * 1024 * 1024)
    with both_doors(tmp_path, ENVIRONMENTS, "--max-message-bytes", limit, bridge_options=("--max-message-bytes", limit)) as running:
        sizes = []
        for door in running.http:
            status, body, events = _call_for_a_34_mb_result(door)
            assert status == 200 and events[-1][0] == "end", (door.name, body[:300])
            sizes.append(len(body))
        assert sizes[0] == sizes[1] and sizes[0] > RESULT_BYTES


def _reason(error: grpc.RpcError) -> str | None:
    return dict(error.trailing_metadata() or ()).get(ERROR_REASON_METADATA_KEY)


def _rich_error(error: grpc.RpcError) -> tuple[status_pb2.Status, error_details_pb2.ErrorInfo]:
    """The google.rpc.Status of a failed call and its one ErrorInfo, checked
    against the call's own code, message and `ors-error-reason`."""
    status = status_pb2.Status.FromString(dict(error.trailing_metadata())[STATUS_DETAILS_METADATA_KEY])
    assert (status.code, status.message) == (error.code().value[0], error.details())
    assert len(status.details) == 1
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert (info.reason, info.domain) == (_reason(error), ERROR_DOMAIN)
    return status, info


def test_an_answer_over_the_limit_is_resource_exhausted_with_a_reason_over_grpc(doors: Doors) -> None:
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    with grpc.insecure_channel(doors.grpc_target, options=options) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        request = pb.CreateEpisodeRequest(session_id="grpc-big", env_name="sizesenv")
        request.task_spec.json = json.dumps({"prompt_bytes": RESULT_BYTES})
        stub.CreateEpisode(request, timeout=30)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetPrompt(pb.GetPromptRequest(session_id="grpc-big"), timeout=60)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        _, info = _rich_error(caught.value)
        assert info.reason == "ERROR_REASON_MESSAGE_TOO_LARGE"
        assert info.metadata["limit_bytes"] == str(DEFAULT_LIMIT) and int(info.metadata["size_bytes"]) > RESULT_BYTES
        call = pb.CallToolRequest(session_id="grpc-big")
        call.call.name, call.call.input.json = "blob", json.dumps({"size": RESULT_BYTES})
        events = stub.CallTool(call, timeout=60)
        assert next(events).task_id
        with pytest.raises(grpc.RpcError) as caught:
            next(events)
        assert _reason(caught.value) == "ERROR_REASON_MESSAGE_TOO_LARGE"
        # On a RunEpisode stream the step fails and the stream goes on.
        create = pb.CreateEpisodeRequest(env_name="sizesenv")
        create.task_spec.json = json.dumps({"prompt_bytes": RESULT_BYTES})
        blob = pb.ToolCallStep(name="blob", task_id="big", input=call.call.input)
        steps = [pb.RunEpisodeRequest(create=create), pb.RunEpisodeRequest(get_prompt=pb.GetPromptRequest()),
                 pb.RunEpisodeRequest(call_tool=blob), pb.RunEpisodeRequest(delete=pb.DeleteEpisodeRequest())]
        answers = list(stub.RunEpisode(iter(steps), timeout=60))
        assert [answer.WhichOneof("step") for answer in answers] == ["create", "error", "error", "delete"]
        for refused in answers[1:3]:
            assert refused.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
            assert refused.error.reason == errors_pb2.ERROR_REASON_MESSAGE_TOO_LARGE
    assert "Traceback" not in doors.http[0].log.read_text()


# ----------------------------------------------------------------------------
# Error contract
# ----------------------------------------------------------------------------


def test_the_environments_code_raising_outside_a_tool_has_its_reason_on_every_door(doors: Doors) -> None:
    with grpc.insecure_channel(doors.grpc_target) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        request = pb.CreateEpisodeRequest(session_id="prompt-fails", env_name="leakypromptenv")
        request.task_spec.json = "{}"
        stub.CreateEpisode(request, timeout=30)
        for call in (lambda: stub.GetPrompt(pb.GetPromptRequest(session_id="prompt-fails"), timeout=30),
                     lambda: stub.ListTaskTools(pb.ListTaskToolsRequest(session_id="prompt-fails"), timeout=30),
                     lambda: stub.ListTasks(pb.ListTasksRequest(env_name="sizesenv", split="train"), timeout=30)):
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == grpc.StatusCode.INTERNAL
            assert _rich_error(caught.value)[1].reason == "ERROR_REASON_ENVIRONMENT_ERROR"
    for door in doors.http:
        status, body, _ = http_request(door.http_url, "GET", "/leakypromptenv/prompt", b"",
                                       {"X-Session-ID": "prompt-fails"})
        assert status == 500 and json.loads(body)["detail"].startswith("RuntimeError: no prompt for token")


def test_a_session_id_that_disagrees_with_the_x_session_id_metadata_is_invalid_argument(doors: Doors) -> None:
    with grpc.insecure_channel(doors.grpc_target) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        request = pb.CreateEpisodeRequest(session_id="mine", env_name="probeenv")
        request.task_spec.json = "{}"
        stub.CreateEpisode(request, metadata=(("x-session-id", "mine"),), timeout=30)
        assert stub.Ping(pb.PingRequest(session_id="mine"), metadata=(("x-session-id", "mine"),)).status == "ok"
        assert stub.Ping(pb.PingRequest(), metadata=(("x-session-id", "mine"),)).status == "ok"
        for method, message in (("Ping", pb.PingRequest(session_id="mine")),
                                ("GetPrompt", pb.GetPromptRequest(session_id="mine")),
                                ("CreateEpisode", pb.CreateEpisodeRequest(session_id="other")),
                                ("DeleteEpisode", pb.DeleteEpisodeRequest(session_id="mine"))):
            with pytest.raises(grpc.RpcError) as caught:
                getattr(stub, method)(message, metadata=(("x-session-id", "someone-else"),), timeout=30)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert _rich_error(caught.value)[1].reason == "ERROR_REASON_SESSION_ID_MISMATCH"
        # An episode created on a RunEpisode stream may be reached by the stream's routing key.
        create = pb.CreateEpisodeRequest(session_id="on-stream", env_name="probeenv")
        create.task_spec.json = "{}"
        stream = stub.RunEpisode(iter([pb.RunEpisodeRequest(create=create)]),
                                 metadata=(("x-session-id", "stream-key"),), timeout=30)
        assert [answer.WhichOneof("step") for answer in stream] == ["create"]
        routed = (("x-session-id", "stream-key"),)
        assert stub.Ping(pb.PingRequest(session_id="on-stream"), metadata=routed).status == "ok"
        stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id="on-stream"), metadata=routed, timeout=30)
        stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id="mine"), timeout=30)


def test_an_episode_this_server_does_not_hold_is_not_found_whatever_routed_the_request(doors: Doors) -> None:
    # As when a client's RunEpisode stream broke with its backend: its calls, routed by the
    # stream's key, reach a backend that never held the episode.
    routed = (("x-session-id", "a-dead-backends-stream-key"),)
    with grpc.insecure_channel(doors.grpc_target) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        for method, message in (("Ping", pb.PingRequest(session_id="held-elsewhere")),
                                ("GetPrompt", pb.GetPromptRequest(session_id="held-elsewhere")),
                                ("ListTaskTools", pb.ListTaskToolsRequest(session_id="held-elsewhere"))):
            with pytest.raises(grpc.RpcError) as caught:
                getattr(stub, method)(message, metadata=routed, timeout=30)
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND, method
            assert _rich_error(caught.value)[1].reason == "ERROR_REASON_SESSION_NOT_FOUND", method
        call = pb.CallToolRequest(session_id="held-elsewhere", call=pb_types.ToolCall(name="echo"))
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.CallTool(call, metadata=routed, timeout=30))
        assert _rich_error(caught.value)[1].reason == "ERROR_REASON_SESSION_NOT_FOUND"
        # Deleting it is done already, as for any gone episode.
        stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id="held-elsewhere"), metadata=routed, timeout=30)


def test_every_error_comes_in_the_rich_error_model_too(doors: Doors) -> None:
    with grpc.insecure_channel(doors.grpc_target) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        failing = {
            "ERROR_REASON_SESSION_NOT_FOUND": lambda: stub.Ping(pb.PingRequest(session_id="nobody"), timeout=30),
            "ERROR_REASON_UNKNOWN_ENVIRONMENT": lambda: stub.ListTools(pb.ListToolsRequest(env_name="no"), timeout=30),
            "ERROR_REASON_INVALID_SPLIT": lambda: stub.NumTasks(pb.NumTasksRequest(env_name="probeenv"), timeout=30),
            # Refused by an interceptor, before the service.
            "ERROR_REASON_INVALID_REQUEST": lambda: channel.unary_unary("/ors.v1.EnvironmentService/Ping")(
                b"\xff\xff", timeout=30),
        }
        for reason, call in failing.items():
            with pytest.raises(grpc.RpcError) as caught:
                call()
            status, info = _rich_error(caught.value)
            assert info.reason == reason and status.message, reason
