"""The protocol's limits, from outside, on both HTTP doors (`serve --http-port`
and the standalone `ors-grpc bridge`) and on gRPC:

- user JSON nested 255, 1,000 or 100,000 levels deep, in every JSON-carrying
  field of every route and RPC, is 400 / INVALID_ARGUMENT with
  ERROR_REASON_JSON_LIMIT naming the field (128 levels pass); so is NaN;
- an environment's error message of 6,000, 40,000 or 1,000,000 characters
  (from `get_prompt`, `setup()`, a tool, or an unknown toolset name) keeps its
  code and status, cut to MAX_ERROR_TEXT_BYTES with the original length;
- prepared episodes whose setup hangs are cancelled after the warm setup
  timeout or by CancelPreparedEpisodes, and the session cap is usable again.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from http_bridge import _openapi
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc._generated.ors.v1 import errors_pb2, types_pb2
from ors_grpc.client import AsyncORSClient
from ors_grpc.protocol.constants import ERROR_REASON_METADATA_KEY, MAX_ERROR_TEXT_BYTES, MAX_JSON_DEPTH
from tests.support.reliability_helpers import Doors, both_doors, eventually, grpc_stub

pytestmark = pytest.mark.timeout(300)

ENVIRONMENTS = ("tests.support.reliability_environments:LimitsEnv",)
ENV = "limitsenv"
JSON_LIMIT = "ERROR_REASON_JSON_LIMIT"
DEPTHS = (255, 1_000, 100_000)
LENGTHS = (6_000, 40_000, 1_000_000)
CUT = re.compile(r" \.\.\. \[cut: (\d+) characters in all\]$")


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    with both_doors(tmp_path_factory.mktemp("limits"), ENVIRONMENTS) as running:
        yield running


def nested_object(depth: int) -> str:
    """JSON text of `depth` objects one inside the other."""
    return '{"a":' * depth + "1" + "}" * depth


def nested_array(depth: int) -> str:
    return "[" * depth + "]" * depth


# ----------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------

#: A body for every route that reads one, with DEEP where user JSON goes
#: (routes without user JSON: in an ordinary field, which the body's own
#: depth bound covers).
BODIES: dict[str, list[str]] = {
    "/create": ['{"env_name":"limitsenv","task_spec":DEEP}'],
    "/{env}/call": ['{"name":"echo_tag","input":DEEP}'],
    "/{env}/prepare": ['{"task_specs":[DEEP]}'],
    "/{env}/cancel_prepared": ['{"task_specs":[DEEP]}'],
    "/{env}/score_group": [
        '{"candidates":[{"messages":[],"metadata":DEEP}]}',
        '{"candidates":[{"messages":[{"role":"user","blocks":[],"detail":DEEP}]}]}',
        '{"candidates":[{"messages":[{"role":"user","blocks":[{"type":"text","text":"t","detail":DEEP}]}]}]}',
        '{"candidates":[{"messages":[{"role":"assistant","blocks":[{"type":"tool_call","id":"c","name":"n",'
        '"input":DEEP}]}]}]}',
        '{"candidates":[{"messages":[{"role":"user","blocks":[{"type":"tool_result","tool_call_id":"c",'
        '"blocks":[{"type":"text","text":"t","detail":DEEP}]}]}]}]}',
    ],
    "/{env}/tasks": ['{"split":DEEP}'],
    "/{env}/num_tasks": ['{"split":DEEP}'],
    "/{env}/task": ['{"split":"train","index":0,"x":DEEP}'],
    "/{env}/get_task": ['{"split":"train","index":0,"x":DEEP}'],
    "/{env}/task_range": ['{"split":DEEP}'],
    "/{env}/get_task_range": ['{"split":DEEP}'],
}


def test_every_route_that_reads_a_body_has_its_deep_json_cases() -> None:
    with_bodies = {op.path for op in _openapi.OPERATIONS if op.body}
    assert with_bodies == set(BODIES)


async def _http_session(http: aiohttp.ClientSession, task: dict[str, Any] | None = None) -> str:
    async with http.post("/create_session") as response:
        sid = (await response.json())["sid"]
    async with http.post("/create", json={"env_name": ENV, "task_spec": task or {"tag": "t"}},
                         headers={"X-Session-ID": sid}) as response:
        assert response.status == 200, await response.text()
    return sid


async def _post(http: aiohttp.ClientSession, path: str, body: str, sid: str, **headers: str) -> tuple[int, Any]:
    async with http.post(path.replace("{env}", ENV), data=body.encode(),
                         headers={"Content-Type": "application/json", "X-Session-ID": sid, **headers}) as response:
        return response.status, await response.json()


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
@pytest.mark.parametrize("depth", DEPTHS)
async def test_deep_json_in_every_field_of_every_route_is_400_naming_it(doors: Doors, door_index: int,
                                                                         depth: int) -> None:
    async with aiohttp.ClientSession(doors.http[door_index].http_url) as http:
        sid = await _http_session(http)
        for path, bodies in BODIES.items():
            for template in bodies:
                for deep in (nested_object(depth), nested_array(depth)):
                    status, answer = await _post(http, path, template.replace("DEEP", deep), str(uuid.uuid4())
                                                 if path == "/create" else sid)
                    assert status == 400, (path, template, answer)
                    assert "nested too deeply" in answer["detail"], (path, answer)
                    assert answer["detail"].startswith("body"), answer


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
async def test_user_json_one_level_over_the_limit_is_400_naming_the_field_and_at_the_limit_passes(
        doors: Doors, door_index: int) -> None:
    async with aiohttp.ClientSession(doors.http[door_index].http_url) as http:
        sid = await _http_session(http)
        over = nested_object(MAX_JSON_DEPTH + 1)
        status, answer = await _post(http, "/{env}/call", f'{{"name":"echo_tag","input":{over}}}', sid)
        assert (status, answer["detail"].split(":")[0]) == (400, "input.a.a.a.a...")
        status, answer = await _post(http, "/{env}/score_group", f'{{"candidates":[{{"messages":[],"metadata":{over}}}]}}',
                                     sid)
        assert status == 400 and answer["detail"].startswith("a candidate's metadata"), answer
        async with http.post(f"/{ENV}/call", data=f'{{"name":"echo_tag","input":{nested_object(MAX_JSON_DEPTH)}}}',
                             headers={"Content-Type": "application/json", "X-Session-ID": sid}) as response:
            assert response.status == 200
            assert "event: end" in await response.text()


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
async def test_brackets_inside_strings_are_text_not_nesting(doors: Doors, door_index: int) -> None:
    brackets = "[{" * (2 * MAX_JSON_DEPTH)
    async with aiohttp.ClientSession(doors.http[door_index].http_url) as http:
        sid = await _http_session(http)
        body = json.dumps({"name": "echo_tag", "input": {brackets: brackets}})
        async with http.post(f"/{ENV}/call", data=body,
                             headers={"Content-Type": "application/json", "X-Session-ID": sid}) as response:
            assert response.status == 200
            assert '"ok":true' in await response.text()


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_non_finite_numbers_are_400_on_every_route(doors: Doors, door_index: int, number: str) -> None:
    async with aiohttp.ClientSession(doors.http[door_index].http_url) as http:
        sid = await _http_session(http)
        for path, bodies in BODIES.items():
            status, answer = await _post(http, path, bodies[0].replace("DEEP", f'{{"x":[{number}]}}'),
                                         str(uuid.uuid4()) if path == "/create" else sid)
            assert status == 400, (path, answer)
            assert "not a JSON number" in answer["detail"], (path, answer)


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
async def test_deep_json_or_nan_in_x_secrets_is_400(doors: Doors, door_index: int) -> None:
    async with aiohttp.ClientSession(doors.http[door_index].http_url) as http:
        for payload in (nested_object(1_000), '{"K":NaN}'):
            header = base64.b64encode(payload.encode()).decode()
            status, answer = await _post(http, "/create", '{"task_spec":{}}', str(uuid.uuid4()),
                                         **{"X-Secrets": header})
            assert status == 400 and answer["detail"].startswith("X-Secrets"), answer


# ----------------------------------------------------------------------------
# gRPC: every JsonValue field of every RPC's request, found by walking the descriptors
# ----------------------------------------------------------------------------


def _json_value_paths(descriptor: Descriptor, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for field in descriptor.fields:
        if field.type != FieldDescriptor.TYPE_MESSAGE or field.message_type.full_name.startswith("google."):
            continue
        if field.message_type is types_pb2.JsonValue.DESCRIPTOR:
            yield (*prefix, field.name)
        elif not field.message_type.GetOptions().map_entry:
            yield from _json_value_paths(field.message_type, (*prefix, field.name))


def _with_json(message: Any, path: tuple[str, ...], text: str) -> None:
    """Set the JsonValue at `path` (adding one element to each repeated field on the way)."""
    *parents, last = path
    for name in parents:
        if "role" in message.DESCRIPTOR.fields_by_name:
            message.role = types_pb2.MESSAGE_ROLE_USER
        field = message.DESCRIPTOR.fields_by_name[name]
        message = getattr(message, name).add() if field.is_repeated else getattr(message, name)
    if "role" in message.DESCRIPTOR.fields_by_name:
        message.role = types_pb2.MESSAGE_ROLE_USER
    field = message.DESCRIPTOR.fields_by_name[last]
    (getattr(message, last).add() if field.is_repeated else getattr(message, last)).json = text


SERVICE = pb.DESCRIPTOR.services_by_name["EnvironmentService"]
RPC_JSON_FIELDS = [(method.name, path) for method in SERVICE.methods
                   for path in _json_value_paths(method.input_type)]


def test_the_walk_finds_the_json_fields_of_every_rpc_that_has_them() -> None:
    rpcs = {name for name, _ in RPC_JSON_FIELDS}
    assert rpcs == {"CreateEpisode", "CallTool", "RunEpisode", "ScoreGroup", "PrepareEpisodes",
                    "CancelPreparedEpisodes"}
    nested_detail = ("candidates", "messages", "blocks", "tool_result", "blocks", "text", "detail")
    assert ("ScoreGroup", nested_detail) in RPC_JSON_FIELDS


async def _grpc_session(stub: pb_grpc.EnvironmentServiceStub) -> str:
    sid = str(uuid.uuid4())
    request = pb.CreateEpisodeRequest(session_id=sid, env_name=ENV)
    request.task_spec.json = '{"tag":"t"}'
    await stub.CreateEpisode(request)
    return sid


async def _run_episode_step_error(stub: pb_grpc.EnvironmentServiceStub, path: tuple[str, ...], text: str) -> Any:
    requests = []
    if path[0] != "create":
        opening = pb.RunEpisodeRequest()
        opening.create.env_name, opening.create.task_spec.json = ENV, '{"tag":"t"}'
        requests.append(opening)
    step = pb.RunEpisodeRequest()
    _with_json(step, path, text)
    if path[0] in ("call_tool",):
        step.call_tool.name, step.call_tool.task_id = "echo_tag", "step-1"
    if path[0] == "score_group":
        step.score_group.task_id = "step-1"
    if path[0] == "create":
        step.create.env_name = ENV
    requests.append(step)
    answers = [answer async for answer in stub.RunEpisode(iter(requests))]
    return answers[-1].error


@pytest.mark.parametrize("depth", DEPTHS)
async def test_deep_json_in_every_json_field_of_every_rpc_is_invalid_argument_json_limit(doors: Doors,
                                                                                          depth: int) -> None:
    async with grpc_stub(doors.grpc_target) as stub:
        sid = await _grpc_session(stub)
        for rpc, path in RPC_JSON_FIELDS:
            for text in (nested_object(depth), nested_array(depth), '{"x":NaN}'):
                if rpc == "RunEpisode":
                    error = await _run_episode_step_error(stub, path, text)
                    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                                          errors_pb2.ERROR_REASON_JSON_LIMIT), (path, error)
                    continue
                request = getattr(pb, method_input(rpc))()
                _with_json(request, path, text)
                if "session_id" in request.DESCRIPTOR.fields_by_name:
                    request.session_id = str(uuid.uuid4()) if rpc == "CreateEpisode" else sid
                if rpc in ("CreateEpisode", "PrepareEpisodes", "CancelPreparedEpisodes"):
                    request.env_name = ENV
                if rpc == "CallTool":
                    request.call.name = "echo_tag"
                call = getattr(stub, rpc)(request)
                with pytest.raises(grpc.aio.AioRpcError) as failure:
                    if SERVICE.methods_by_name[rpc].server_streaming:
                        async for _ in call:
                            pass
                    else:
                        await call
                reason = dict(failure.value.trailing_metadata() or ()).get(ERROR_REASON_METADATA_KEY)
                assert (failure.value.code(), reason) == (grpc.StatusCode.INVALID_ARGUMENT, JSON_LIMIT), (rpc, path)
                assert len(failure.value.details().encode()) <= MAX_ERROR_TEXT_BYTES


def method_input(rpc: str) -> str:
    return SERVICE.methods_by_name[rpc].input_type.name


async def test_the_python_client_refuses_deep_json_and_nan_before_sending(doors: Doors) -> None:
    deep: Any = 1
    for _ in range(1_000):
        deep = {"a": deep}
    async with AsyncORSClient(doors.grpc_target) as client:
        environment = client.environment(ENV)
        async with environment.session(task={"tag": "t"}) as session:
            for bad in (deep, {"x": float("nan")}):
                with pytest.raises(ValueError, match="nested too deeply|not a JSON number"):
                    await session.call_tool("echo_tag", {"value": bad})
            assert (await session.call_tool("echo_tag", {})).blocks  # the session is fine


# ----------------------------------------------------------------------------
# Long error messages
# ----------------------------------------------------------------------------


def _assert_cut(text: str, length: int) -> None:
    assert len(text.encode()) <= MAX_ERROR_TEXT_BYTES, len(text)
    marker = CUT.search(text)
    assert marker is not None, text[-80:]
    assert int(marker.group(1)) >= length


async def _grpc_failure(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await call
    return failure.value


@pytest.mark.parametrize("length", LENGTHS)
async def test_long_error_messages_keep_their_code_on_grpc_cut_with_their_length(doors: Doors, length: int) -> None:
    async with grpc_stub(doors.grpc_target) as stub:
        expected = {"prompt": (grpc.StatusCode.INTERNAL, "ERROR_REASON_ENVIRONMENT_ERROR"),
                    "setup": (grpc.StatusCode.FAILED_PRECONDITION, "ERROR_REASON_SETUP_FAILED")}
        for where, (code, reason) in expected.items():
            sid = str(uuid.uuid4())
            request = pb.CreateEpisodeRequest(session_id=sid, env_name=ENV)
            request.task_spec.json = json.dumps({"fail": where, "length": length})
            await stub.CreateEpisode(request)
            for _ in range(3):  # every answer of a failed session, not only the first
                failure = await _grpc_failure(stub.GetPrompt(pb.GetPromptRequest(session_id=sid)))
                assert (failure.code(), dict(failure.trailing_metadata())[ERROR_REASON_METADATA_KEY]) == (code, reason)
                _assert_cut(failure.details(), length)
        request = pb.CreateEpisodeRequest(session_id=str(uuid.uuid4()), env_name=ENV, toolset_name="z" * length)
        request.task_spec.json = "{}"
        failure = await _grpc_failure(stub.CreateEpisode(request))
        assert failure.code() == grpc.StatusCode.INVALID_ARGUMENT
        _assert_cut(failure.details(), length)
        sid = await _grpc_session(stub)
        call = pb.CallToolRequest(session_id=sid)
        call.call.name, call.call.input.json = "long_failure", json.dumps({"length": length})
        events = [event async for event in stub.CallTool(call)]
        _assert_cut(events[-1].failure.message, length)


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
@pytest.mark.parametrize("length", LENGTHS)
async def test_long_error_messages_keep_their_http_status_cut_with_their_length(doors: Doors, door_index: int,
                                                                               length: int) -> None:
    async with aiohttp.ClientSession(doors.http[door_index].http_url) as http:
        for where in ("prompt", "setup"):
            sid = await _http_session(http, {"fail": where, "length": length})
            async with http.get(f"/{ENV}/prompt", headers={"X-Session-ID": sid}) as response:
                assert response.status == 500 and "Retry-After" not in response.headers
                _assert_cut((await response.json())["detail"], length)
        async with http.post("/create_session") as response:
            sid = (await response.json())["sid"]
        async with http.post("/create", json={"task_spec": {}, "toolset_name": "z" * length},
                             headers={"X-Session-ID": sid}) as response:
            assert response.status == 400
            _assert_cut((await response.json())["detail"], length)
        sid = await _http_session(http)
        async with http.post(f"/{ENV}/call", json={"name": "long_failure", "input": {"length": length}},
                             headers={"X-Session-ID": sid}) as response:
            text = await response.text()
        error = text.split("event: error\ndata: ", 1)[1].split("\n", 1)[0]
        _assert_cut(error, length)


def test_a_cut_error_text_is_logged_whole(doors: Doors) -> None:
    log = doors.http[0].log.read_text(errors="replace")
    assert "t" * 1_000_000 in log  # the tool's failure, at WARNING
    assert re.search(r"error_text_cut what=ERROR_REASON_UNKNOWN_TOOLSET length=\d+ text=unknown toolset 'z{1000000}'",
                     log)


# ----------------------------------------------------------------------------
# Hanging warm setups
# ----------------------------------------------------------------------------

CAP = 4


@pytest.fixture(scope="module")
def warm_doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    with both_doors(tmp_path_factory.mktemp("warm"), ENVIRONMENTS, "--max-sessions", str(CAP),
                    "--warm-setup-timeout", "2") as running:
        yield running


async def _open_sessions_held(stub: pb_grpc.EnvironmentServiceStub, count: int) -> None:
    """Prepares `count` episodes whose setup hangs."""
    request = pb.PrepareEpisodesRequest(env_name=ENV)
    for index in range(count):
        request.task_specs.add().json = json.dumps({"hang": True, "n": index})
    assert (await stub.PrepareEpisodes(request)).preparing == count


async def test_hanging_warm_setups_are_cancelled_after_the_bound_and_the_cap_is_usable(warm_doors: Doors) -> None:
    async with grpc_stub(warm_doors.grpc_target) as stub:
        await _open_sessions_held(stub, CAP)
        creation = pb.CreateEpisodeRequest(session_id=str(uuid.uuid4()), env_name=ENV)
        creation.task_spec.json = '{"tag":"t"}'
        failure = await _grpc_failure(stub.CreateEpisode(creation))
        assert failure.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # the cap is full of hanging setups

        async def room_again() -> bool:
            try:
                await stub.CreateEpisode(creation)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                return False
            return True

        await eventually(room_again, "the hanging setups to be cancelled")
        await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=creation.session_id))
    assert "warm_setup_timed_out" in warm_doors.http[0].log.read_text()


@pytest.mark.parametrize("way", ["grpc", "http", "python client"])
async def test_cancelling_prepared_episodes_frees_their_places(tmp_path: Path, way: str) -> None:
    with both_doors(tmp_path, ENVIRONMENTS, "--max-sessions", str(CAP)) as running:
        async with grpc_stub(running.grpc_target) as stub:
            await _open_sessions_held(stub, CAP)
            hanging = [{"hang": True, "n": index} for index in range(CAP)]
            if way == "grpc":
                request = pb.CancelPreparedEpisodesRequest(env_name=ENV)
                request.task_specs.add().json = json.dumps(hanging[0])
                assert (await stub.CancelPreparedEpisodes(request)).cancelled == 1
                cancelled_all = await stub.CancelPreparedEpisodes(pb.CancelPreparedEpisodesRequest(env_name=ENV))
                assert cancelled_all.cancelled == CAP - 1
            elif way == "http":
                async with aiohttp.ClientSession(running.http[1].http_url) as http:
                    async with http.post(f"/{ENV}/cancel_prepared", json={"task_specs": hanging[:2]}) as response:
                        assert (response.status, await response.json()) == (200, {"cancelled": 2})
                    async with http.post(f"/{ENV}/cancel_prepared", json={"secrets": {"K": "other"}}) as response:
                        assert await response.json() == {"cancelled": 0}  # prepared with other secrets
                    async with http.post(f"/{ENV}/cancel_prepared", json={}) as response:
                        assert await response.json() == {"cancelled": CAP - 2}
            else:
                async with AsyncORSClient(running.grpc_target) as client:
                    assert await client.environment(ENV).cancel_prepared(hanging[:1]) == 1
                    assert await client.environment(ENV).cancel_prepared() == CAP - 1
            assert (await stub.Health(pb.HealthRequest())).open_sessions == 0
            for _ in range(CAP):  # every place is free again
                await _grpc_session(stub)
