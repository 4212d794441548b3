"""Hostile input to every HTTP route and every RPC: always a client error with a
message (4xx / INVALID_ARGUMENT or another documented code), never a 500,
INTERNAL or UNKNOWN, never a crash; the server keeps serving.

Property-based (hypothesis) against one `ors-grpc serve` subprocess. Routes
and RPCs are enumerated from the bridge's router and the service descriptor,
so a new route or RPC is covered without editing this file.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import urllib.parse
import uuid
from typing import Any, Iterator

import aiohttp
import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from http_bridge.app import create_app
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.client import ORSServerError
from tests.support.reliability_helpers import grpc_call, grpc_episode, grpc_stub, http_call, http_episode, serve_probe
from tests.support.servers import ServeProcess

pytestmark = pytest.mark.timeout(300)

LIMIT_BYTES = 4 * 1024 * 1024
HYPOTHESIS = settings(
    max_examples=int(os.environ.get("ORS_HOSTILE_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
SERVICE = pb.DESCRIPTOR.services_by_name["EnvironmentService"]
#: Codes a well-behaved server may answer to bad input (see ors_grpc/errors.py).
CLIENT_ERROR_CODES = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    # ScoreGroup on an environment without score_group (SCORE_GROUP_UNSUPPORTED).
    grpc.StatusCode.UNIMPLEMENTED,
}


class Live:
    """The server under test and one live session on it."""

    serve: ServeProcess
    sid: str


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    # The tool timeout bounds any tool a generated call might happen to start.
    with serve_probe("--max-message-bytes", str(LIMIT_BYTES), "--tool-timeout", "5") as serve:
        state = Live()
        state.serve = serve
        state.sid = asyncio.run(_live_session(serve.grpc_target))
        yield state


async def _live_session(target: str) -> str:
    async with grpc_stub(target) as stub:
        return await grpc_episode(stub, "live")


@pytest.fixture(autouse=True)
def still_serving(live: Live) -> Iterator[None]:
    """After every test (all its examples): the server is alive and answers health on both doors."""
    yield
    _assert_still_serving(live)


def _assert_still_serving(live: Live) -> None:
    assert live.serve.proc.poll() is None, "the server process died"
    status, body, _ = http_request(live, "GET", "/health", b"", {})
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    with grpc.insecure_channel(live.serve.grpc_target) as channel:
        assert pb_grpc.EnvironmentServiceStub(channel).Health(pb.HealthRequest(), timeout=10).status == "ok"


# ----------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------

ROUTES = sorted(
    {(route.method, route.resource.canonical) for route in create_app("unused:1").router.routes()
     if route.method != "HEAD"}
)
JSON_KEYS = ["split", "index", "start", "stop", "name", "input", "task_id", "task_spec", "env_name", "secrets"]
#: Any code point, lone surrogates included (JSON `"\ud800"`, which protobuf cannot hold).
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=20)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | ANY_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


BODIES = st.one_of(
    st.binary(max_size=300),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    # The routes' own fields with values of any type and shape.
    st.dictionaries(st.sampled_from(JSON_KEYS), JSON_VALUES, max_size=6).map(lambda value: json.dumps(value).encode()),
    st.integers(1, 200_000).map(_deep),
    st.sampled_from([1_000, 100_000, 1_000_000]).map(lambda n: json.dumps({"split": "x" * n, "name": "y" * n}).encode()),
    st.just(b'{"index": ' + b"9" * 5000 + b"}"),
)
HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
#: Header values as bytes, UTF-8 or not (aiohttp keeps undecodable bytes as surrogates).
HEADER_BYTES = st.binary(max_size=40).filter(lambda value: not any(c in value for c in b"\r\n\x00"))
ENV_SEGMENTS = st.one_of(st.sampled_from(["probeenv", "PROBEENV", "nosuchenv"]), st.text(max_size=20))


def http_request(live: Live, method: str, path: str, body: bytes, headers: dict[str, str | bytes]) -> tuple[int, bytes, dict]:
    host, port = live.serve.http_url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        try:
            connection.request(method, path, body=body, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered (and closed) before reading the whole body: its answer is read below
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


def _assert_client_error_with_detail(status: int, body: bytes, headers: dict, where: str) -> None:
    assert status < 500, (where, status, body[:300])
    if status >= 400:
        detail = json.loads(body)["detail"]
        assert isinstance(detail, str) and detail, where
    elif 300 <= status < 400:
        assert headers["Location"].startswith("/"), where


@given(
    route=st.sampled_from(ROUTES),
    env=ENV_SEGMENTS,
    body=BODIES,
    session=st.one_of(st.none(), st.just("live"), HEADER_TEXT, HEADER_BYTES),
    secrets_header=st.one_of(st.none(), HEADER_TEXT, HEADER_BYTES),
)
@HYPOTHESIS
def test_every_http_route_answers_hostile_input_with_a_4xx_and_a_detail(
    live: Live, route: tuple[str, str], env: str, body: bytes, session: str | bytes | None,
    secrets_header: str | bytes | None,
) -> None:
    method, template = route
    path = template.replace("{env}", urllib.parse.quote(env, safe="") or "probeenv")
    headers = {"Content-Type": "application/json"}
    if session is not None:
        headers["X-Session-ID"] = live.sid if session == "live" else session
    if secrets_header is not None:
        headers["X-Secrets"] = secrets_header
    status, response_body, response_headers = http_request(live, method, path, body, headers)
    _assert_client_error_with_detail(status, response_body, response_headers, f"{method} {path}")


@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]), path=st.text(max_size=40), body=BODIES)
@HYPOTHESIS
def test_arbitrary_paths_and_methods_are_never_a_server_error(live: Live, method: str, path: str, body: bytes) -> None:
    target = "/" + urllib.parse.quote(path, safe="/")
    status, response_body, headers = http_request(live, method, target, body, {})
    _assert_client_error_with_detail(status, response_body, headers, f"{method} {target}")


@pytest.mark.parametrize("route", [route for route in ROUTES if route[0] == "POST"])
def test_an_oversized_body_is_413_on_every_post_route(live: Live, route: tuple[str, str]) -> None:
    path = route[1].replace("{env}", "probeenv")
    body = b'{"split": "' + b"x" * LIMIT_BYTES + b'"}'
    status, response_body, _ = http_request(live, "POST", path, body, {"X-Session-ID": live.sid})
    assert status == 413 and json.loads(response_body)["detail"], path


# ----------------------------------------------------------------------------
# gRPC
# ----------------------------------------------------------------------------

METHODS = sorted(SERVICE.methods, key=lambda method: method.name)
#: Drain acts on the whole server (an empty request is a valid one): a request that parses would
#: drain the shared server (tests/service/test_drain.py covers it).
METHODS_WITHOUT_DRAIN = [method for method in METHODS if method.name != "Drain"]


def _callable(channel: grpc.Channel, method: Any, serialize: Any = None) -> Any:
    """A function sending one request to `method` (raw bytes unless `serialize`)."""
    path = f"/{SERVICE.full_name}/{method.name}"
    if method.server_streaming:
        stream = channel.unary_stream(path, request_serializer=serialize)
        return lambda request: list(stream(request, timeout=30))
    unary = channel.unary_unary(path, request_serializer=serialize)
    return lambda request: unary(request, timeout=30)


def _call_code(call: Any, request: Any) -> tuple[grpc.StatusCode, str]:
    try:
        call(request)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def _assert_grpc_client_error(code: grpc.StatusCode, details: str, where: str) -> None:
    assert code in CLIENT_ERROR_CODES, (where, code, details[:300])
    if code != grpc.StatusCode.OK:
        assert details, where


@pytest.fixture(scope="module")
def channel(live: Live) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(live.serve.grpc_target) as channel:
        yield channel


@given(method=st.sampled_from(METHODS_WITHOUT_DRAIN), raw=st.binary(max_size=500))
@HYPOTHESIS
def test_every_rpc_answers_arbitrary_bytes_with_a_client_error(live: Live, channel: grpc.Channel, method: Any, raw: bytes) -> None:
    code, details = _call_code(_callable(channel, method), raw)
    _assert_grpc_client_error(code, details, method.name)


@pytest.mark.parametrize("method", METHODS, ids=lambda method: method.name)
def test_request_bytes_that_do_not_parse_are_invalid_argument_on_every_rpc(channel: grpc.Channel, method: Any) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _callable(channel, method)(b"\xff\xff\xff")
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("malformed request message: ")
    assert dict(error.trailing_metadata())["ors-error-reason"] == "ERROR_REASON_INVALID_REQUEST"


JSON_TEXT = st.one_of(
    st.text(max_size=50),
    JSON_VALUES.map(json.dumps),
    st.integers(1, 200_000).map(lambda depth: "[" * depth),
    st.just('{"a": ' + "9" * 5000 + "}"),
)


def _strings(live: Live) -> st.SearchStrategy[str]:
    # Session ids, env names, splits and tool names the server knows, so
    # garbage reaches deep code paths too; and arbitrary or huge strings.
    known = ["probeenv", "train", "echo_tag", "stats", "slow", "submit", live.sid, "0" * 32]
    return st.one_of(st.sampled_from(known), st.text(max_size=30), st.just("x" * 1_000_000))


def _message(descriptor: Descriptor, live: Live, depth: int = 0) -> st.SearchStrategy[dict]:
    """Keyword arguments for a message of `descriptor`, every field optional."""
    if descriptor.full_name == "ors.v1.JsonValue":
        return st.fixed_dictionaries({"json": JSON_TEXT})
    fields = {}
    for field in descriptor.fields:
        value = _field(field, live, depth)
        if value is not None:
            fields[field.name] = st.lists(value, max_size=3) if _repeated(field) else value
    return st.fixed_dictionaries({}, optional=fields)


def _repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated and not _is_map(field)


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _field(field: FieldDescriptor, live: Live, depth: int) -> st.SearchStrategy[Any] | None:
    if _is_map(field):
        return st.dictionaries(_strings(live), _strings(live), max_size=3)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return None if depth > 3 else _message(field.message_type, live, depth + 1)
    if field.type == FieldDescriptor.TYPE_STRING:
        return _strings(live)
    if field.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_INT32):
        return st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-5, 5))
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_ENUM:
        # Known values, and numbers the server's enum does not have.
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-5, 2**31 - 1))
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    raise AssertionError(f"no strategy for {field.full_name}")


@st.composite
def _typed_requests(draw: Any, live: Live) -> tuple[Any, Any]:
    method = draw(st.sampled_from(METHODS_WITHOUT_DRAIN))
    request_class = getattr(pb, method.input_type.name)
    return method, request_class(**draw(_message(method.input_type, live)))


def test_every_rpc_answers_well_typed_garbage_with_a_client_error(live: Live, channel: grpc.Channel) -> None:
    @given(pair=_typed_requests(live))
    @HYPOTHESIS
    def check(pair: tuple[Any, Any]) -> None:
        method, request = pair
        serialize = type(request).SerializeToString
        code, details = _call_code(_callable(channel, method, serialize), request)
        _assert_grpc_client_error(code, details, method.name)

    check()


@pytest.fixture
def run_episode(channel: grpc.Channel) -> Any:
    return channel.stream_stream(
        f"/{SERVICE.full_name}/RunEpisode",
        request_serializer=pb.RunEpisodeRequest.SerializeToString,
        response_deserializer=pb.RunEpisodeResponse.FromString,
    )


def test_an_oversized_run_episode_step_ends_the_stream_with_resource_exhausted(run_episode: Any) -> None:
    steps = [pb.RunEpisodeRequest(get_prompt=pb.GetPromptRequest(session_id="no-such-session")),
             pb.RunEpisodeRequest(create=pb.CreateEpisodeRequest(session_id="x" * LIMIT_BYTES))]
    with pytest.raises(grpc.RpcError) as caught:
        for _ in run_episode(iter(steps), timeout=30):
            pass
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and caught.value.details()


def test_any_sequence_of_run_episode_steps_gets_one_answer_per_step(live: Live, run_episode: Any) -> None:
    steps = st.lists(_message(pb.RunEpisodeRequest.DESCRIPTOR, live).map(lambda kw: pb.RunEpisodeRequest(**kw)),
                     max_size=6)

    @given(steps=steps)
    @HYPOTHESIS
    def check(steps: list[pb.RunEpisodeRequest]) -> None:
        answers, code = [], grpc.StatusCode.OK
        try:
            answers.extend(run_episode(iter(steps), timeout=30))
        except grpc.RpcError as error:
            code = error.code()
        oversized = [i for i, step in enumerate(steps) if step.ByteSize() > LIMIT_BYTES]
        if oversized:
            # gRPC refuses a message over the limit by ending the whole call.
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and len(answers) <= oversized[0]
        else:
            assert code == grpc.StatusCode.OK and len(answers) == len(steps)
        for step, answer in zip(steps, answers):
            if answer.WhichOneof("step") == "error":
                failure = ORSServerError.from_step_error(answer.error)
                _assert_grpc_client_error(failure.code, failure.message, f"RunEpisode.{step.WhichOneof('step')}")

    check()


@pytest.mark.parametrize("method", METHODS, ids=lambda method: method.name)
def test_an_oversized_request_is_resource_exhausted_on_every_rpc(channel: grpc.Channel, method: Any) -> None:
    code, details = _call_code(_callable(channel, method), b"\x00" * (LIMIT_BYTES + 1024))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and details


# ----------------------------------------------------------------------------
# Session ids and task ids
# ----------------------------------------------------------------------------

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
SAMPLE = 200


def _is_uuid4(text: str) -> bool:
    return bool(UUID4.match(text)) and uuid.UUID(text).version == 4


async def test_session_ids_are_distinct_uuid4_through_both_doors(live: Live) -> None:
    async with aiohttp.ClientSession(base_url=live.serve.http_url) as http, grpc_stub(live.serve.grpc_target) as stub:
        ids = []
        for _ in range(SAMPLE // 2):
            async with http.post("/create_session") as response:
                ids.append((await response.json())["sid"])
            ids.append((await stub.CreateSessionId(pb.CreateSessionIdRequest())).session_id)
        async with http.post("/create_session", headers={"Accept": "text/event-stream"}) as response:
            ids.append(re.search(r"event: task_id\ndata: (\S+)", await response.text()).group(1))
    assert all(_is_uuid4(sid) for sid in ids), ids[:3]
    assert len(set(ids)) == len(ids)


async def test_task_ids_are_distinct_random_uuid4_hex(live: Live) -> None:
    async with grpc_stub(live.serve.grpc_target) as stub:
        sid = await grpc_episode(stub, "task-ids")
        task_ids = [(await grpc_call(stub, sid, "echo_tag"))[0].task_id for _ in range(50)]
    assert all(_is_uuid4(str(uuid.UUID(hex=task_id))) and len(task_id) == 32 for task_id in task_ids)
    assert len(set(task_ids)) == len(task_ids)


async def test_one_session_cannot_attach_to_another_sessions_call_over_http(live: Live) -> None:
    async with aiohttp.ClientSession(base_url=live.serve.http_url) as http:
        owner = await http_episode(http, "owner")
        intruder = await http_episode(http, "intruder")
        body = {"name": "slow", "input": {"seconds": 1.0}}
        async with http.post("/probeenv/call", json=body, headers={"X-Session-ID": owner}) as running:
            assert await running.content.readline() == b"event: task_id\n"
            task_id = (await running.content.readline()).decode().removeprefix("data: ").strip()
            # Running, then finished: neither is visible from the other session.
            stolen = await http_call(http, intruder, "slow", {"seconds": 1.0}, task_id=task_id)
            assert stolen.events == [("error", "unknown task_id")]
            rest = (await running.read()).decode()
        assert '"text":"slow run 1"' in rest
        stolen = await http_call(http, intruder, "slow", {"seconds": 1.0}, task_id=task_id)
        assert stolen.events == [("error", "unknown task_id")]
        owned = await http_call(http, owner, "slow", {"seconds": 1.0}, task_id=task_id)
        assert owned.result()["output"]["blocks"][0]["text"] == "slow run 1"
        for sid in (owner, intruder):
            stats = (await http_call(http, sid, "stats")).result()["output"]["metadata"]
            assert stats["runs"] == ({"slow": 1} if sid == owner else {})
