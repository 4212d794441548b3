"""The HTTP/SSE bridge over raw HTTP, against `ors-grpc serve ... --http-port 0`."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import AsyncIterator, Iterator

import aiohttp
import pytest

from ors_grpc._runtime.tool_calls import EPISODE_FINISHED
from ors_grpc.protocol.constants import DEFAULT_MAX_MESSAGE_BYTES
from tests.support.bridge_http import call, create_episode, new_session_id, parse_sse, read_sse
from tests.support.environments import TEST_TASKS, TRAIN_TASKS
from tests.support.servers import ServeProcess, start_serve

#: The refusals of a bad split and index: the reference's words first, then what is valid.
BAD_SPLIT = "Invalid split: 'nope' is not a split of echoenv (its splits: train, test)"
RANGE = "which has 3 tasks (0 to 2, or -3 to -1 from the end)"

ENVIRONMENTS = ["tests.support.environments:EchoEnv", "tests.support.environments:SlowSetupEnv", "tests.support.environments:FailingSetupEnv"]


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with start_serve(*ENVIRONMENTS, "--http-port", "0") as process:
        yield process


@pytest.fixture
async def http(serve: ServeProcess) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=serve.http_url) as session:
        yield session


# ----------------------------------------------------------------------------
# Discovery
# ----------------------------------------------------------------------------


async def test_health_version_and_environments(http: aiohttp.ClientSession) -> None:
    async with http.get("/health") as response:
        assert await response.json() == {"status": "ok"}
    async with http.get("/version") as response:
        assert set(await response.json()) == {"version"}
    async with http.get("/list_environments") as response:
        assert await response.json() == ["echoenv", "slowsetupenv", "failingsetupenv"]


async def test_tools_and_splits(http: aiohttp.ClientSession) -> None:
    async with http.get("/echoenv/tools") as response:
        tools = (await response.json())["tools"]
    by_name = {tool["name"]: tool for tool in tools}
    assert list(tools[0]) == ["name", "description", "input_schema"]
    assert by_name["echo"]["input_schema"]["required"] == ["text"]
    assert by_name["fail"]["input_schema"] is None
    assert "hint" not in by_name
    async with http.get("/ECHOENV/splits") as response:
        assert await response.json() == [{"name": "train", "type": "train"}, {"name": "test", "type": "test"}]


async def test_tasks_are_lossless_and_aliases_work(http: aiohttp.ClientSession) -> None:
    async with http.post("/EchoEnv/tasks", json={"split": "train"}) as response:
        text = await response.text()
    assert json.loads(text) == {"tasks": TRAIN_TASKS, "env_name": "EchoEnv"}
    assert '"big":1180591620717411303424' in text and '"ratio":1.0' in text and "😀" in text
    async with http.post("/echoenv/num_tasks", json={"split": "test"}) as response:
        assert await response.json() == {"num_tasks": len(TEST_TASKS)}
    for path in ("/echoenv/task", "/echoenv/get_task"):
        async with http.post(path, json={"split": "train", "index": 2}) as response:
            assert await response.json() == {"task": TRAIN_TASKS[2], "env_name": "echoenv"}
    for path in ("/echoenv/task_range", "/echoenv/get_task_range"):
        async with http.post(path, json={"split": "train", "start": -2}) as response:
            assert await response.json() == {"tasks": TRAIN_TASKS[-2:], "env_name": "echoenv"}


async def test_a_negative_index_counts_from_the_end_as_in_the_reference(http: aiohttp.ClientSession) -> None:
    async with http.post("/echoenv/task", json={"split": "train", "index": -1}) as response:
        assert await response.json() == {"task": TRAIN_TASKS[-1], "env_name": "echoenv"}
    sid = await create_episode(http, {"split": "test", "index": -2})
    async with http.get("/echoenv/prompt", headers={"X-Session-ID": sid}) as response:
        assert (await response.json())[0]["text"] == TEST_TASKS[-2]["question"]


@pytest.mark.parametrize(
    ("path", "body", "status", "detail"),
    [
        ("/echoenv/tasks", {"split": "nope"}, 400, BAD_SPLIT),
        ("/echoenv/num_tasks", {"split": "nope"}, 400, BAD_SPLIT),
        ("/echoenv/task", {"split": "train", "index": 3}, 400, f"Invalid index: 3 is out of range for split 'train', {RANGE}"),
        ("/echoenv/task", {"split": "train", "index": -4}, 400, f"Invalid index: -4 is out of range for split 'train', {RANGE}"),
        # Clamped to int64 on the hop (no split has 2^63 tasks).
        ("/echoenv/task", {"split": "train", "index": 2**80}, 400,
         f"Invalid index: {2**63 - 1} is out of range for split 'train', {RANGE}"),
        ("/echoenv/task_range", {"split": "nope"}, 400, BAD_SPLIT),
    ],
)
async def test_discovery_errors_say_what_is_valid(http: aiohttp.ClientSession, path: str, body: dict, status: int, detail: str) -> None:
    async with http.post(path, json=body) as response:
        assert response.status == status
        assert await response.json() == {"detail": detail}


async def test_bare_paths_redirect_to_the_default_environment(http: aiohttp.ClientSession) -> None:
    async with http.get("/tools?x=1", allow_redirects=False) as response:
        assert response.status == 308
        assert response.headers["Location"] == "/echoenv/tools?x=1"
    async with http.post("/tasks", json={"split": "test"}) as response:  # follows the 308, body kept
        assert await response.json() == {"tasks": TEST_TASKS, "env_name": "echoenv"}
    async with http.get("/nowhere/tools", allow_redirects=False) as response:  # a typo: no 308 but the names
        assert response.status == 404
        hosted = ", ".join(await (await http.get("/list_environments")).json())
        assert await response.json() == {"detail": f"unknown environment 'nowhere'; this server hosts: {hosted}"}
    async with http.get("/nowhere", allow_redirects=False) as response:  # not a route: no 308 either
        assert (response.status, await response.json()) == (404, {"detail": "Not Found"})


async def test_discovery_tolerates_a_session_header(http: aiohttp.ClientSession) -> None:
    async with http.get("/echoenv/splits", headers={"X-Session-ID": "throwaway"}) as response:
        assert response.status == 200


# ----------------------------------------------------------------------------
# Sessions and episodes
# ----------------------------------------------------------------------------


async def test_create_session_answers_sse_or_json_by_accept(http: aiohttp.ClientSession) -> None:
    async with http.post("/create_session", headers={"Accept": "text/event-stream"}) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        stream = await read_sse(response)
    assert stream.names() == ["task_id", "end"]
    assert len(stream.data("task_id")) == 36 and stream.data("end") == ""
    async with http.post("/create_session", json={"env": {"X": "1"}}) as response:  # extra field ignored
        assert len((await response.json())["sid"]) == 36


async def test_full_episode(http: aiohttp.ClientSession) -> None:
    sid = await create_episode(http, {"split": "train", "index": 0, "priority": "ignored"})
    headers = {"X-Session-ID": sid}
    async with http.get("/echoenv/prompt", headers=headers) as response:
        assert await response.json() == [{"text": "Say hello", "detail": None, "type": "text"}]
    async with http.get("/failingsetupenv/task_tools", headers=headers) as response:  # any env in the path
        names = [tool["name"] for tool in (await response.json())["tools"]]
    assert names[-1] == "hint" and "echo" in names

    added = await call(http, sid, "add", {"a": 2, "b": 40})
    assert added.names() == ["task_id", "end"] and len(added.data("task_id")) == 32
    assert added.result() == {
        "ok": True,
        "output": {"blocks": [{"text": "42", "detail": None, "type": "text"}], "metadata": None, "reward": 0.0, "finished": False},
    }
    meta = (await call(http, sid, "metadata", {})).events[-1][1]
    assert '"big":1180591620717411303424' in meta and '"float":1.0' in meta and '"detail":{"b":1,"a":1.0}' in meta
    assert (await call(http, sid, "nope", {})).result()["ok"] is False
    assert (await call(http, sid, "add", {"a": "x"})).result()["ok"] is False
    failed = await call(http, sid, "fail", {})
    assert failed.events[1:] == [("error", "boom")]

    submitted = (await call(http, sid, "submit", {"answer": "hello"})).result()["output"]
    assert (submitted["reward"], submitted["finished"]) == (1.0, True)
    assert (await call(http, sid, "echo", {"text": "late"})).result() == {
        "ok": False, "error": EPISODE_FINISHED.format(name="echo"), "reason": "episode_finished"}

    async with http.post("/ping", headers=headers) as response:
        assert await response.json() == {"status": "ok"}
    for path in ("/delete", "/delete", "/delete_session"):
        async with http.post(path, headers=headers) as response:
            assert (response.status, await response.json()) == (200, {"sid": sid})
    async with http.post("/ping", headers=headers) as response:
        assert (response.status, await response.json()) == (
            404, {"detail": f"Active environment not found: no open episode has session id {sid!r}"})


async def test_episode_from_a_task_spec_keeps_user_json(http: aiohttp.ClientSession) -> None:
    spec = {"id": 7, "question": "Q?", "answer": "a", "big": 2**64 + 1, "f": 2.0}
    sid = await create_episode(http, {"env_name": "EchoEnv", "task_spec": spec})
    async with http.post("/echoenv/call", json={"name": "submit", "input": {"answer": "a"}}, headers={"X-Session-ID": sid}) as response:
        assert (await read_sse(response)).result()["output"]["reward"] == 1.0


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        ({"split": "nope", "index": 0}, 400, BAD_SPLIT),
        ({"split": "train", "index": 9}, 400, f"Invalid index: 9 is out of range for split 'train', {RANGE}"),
        ({"env_name": "nope", "split": "train", "index": 0}, 404,
         "unknown environment 'nope'; this server hosts: echoenv, slowsetupenv, failingsetupenv"),
    ],
)
async def test_create_errors(http: aiohttp.ClientSession, body: dict, status: int, detail: str) -> None:
    sid = await new_session_id(http)
    async with http.post("/create", json=body, headers={"X-Session-ID": sid}) as response:
        assert (response.status, await response.json()) == (status, {"detail": detail})


async def test_create_twice_is_refused(http: aiohttp.ClientSession) -> None:
    sid = await create_episode(http, {"split": "train", "index": 1})
    async with http.post("/create", json={"split": "train", "index": 1}, headers={"X-Session-ID": sid}) as response:
        assert (response.status, await response.json()) == (400, {"detail": "Session already exists"})


async def test_session_routes_need_a_session_id(http: aiohttp.ClientSession) -> None:
    for method, path in [("POST", "/ping"), ("POST", "/create"), ("GET", "/echoenv/prompt"), ("POST", "/echoenv/call"), ("POST", "/delete")]:
        async with http.request(method, path, json={"split": "train", "index": 0}) as response:
            assert (response.status, await response.json()) == (400, {"detail": "X-Session-ID header is required"})


async def test_unknown_session(http: aiohttp.ClientSession) -> None:
    headers = {"X-Session-ID": "never-created"}
    async with http.get("/echoenv/prompt", headers=headers) as response:
        assert (response.status, await response.json()) == (
            404, {"detail": "Active environment not found: no open episode has session id 'never-created'"})
    async with http.post("/echoenv/call", json={"name": "echo", "input": {}}, headers=headers) as response:
        assert response.status == 404


async def test_setup_failure_is_a_real_500(http: aiohttp.ClientSession) -> None:
    sid = await create_episode(http, {"env_name": "failingsetupenv", "split": "train", "index": 0})
    async with http.get("/failingsetupenv/prompt", headers={"X-Session-ID": sid}) as response:
        assert (response.status, await response.json()) == (500, {"detail": "RuntimeError: setup exploded"})
    async with http.post("/failingsetupenv/call", json={"name": "echo", "input": {"text": "x"}}, headers={"X-Session-ID": sid}) as response:
        assert (response.status, await response.json()) == (500, {"detail": "RuntimeError: setup exploded"})


async def test_secrets_from_header_and_body_are_merged(http: aiohttp.ClientSession) -> None:
    header = base64.b64encode(json.dumps({"FROM_HEADER": {"value": "h"}, "PLAIN": "p"}).encode()).decode()
    body = {"split": "train", "index": 0, "secrets": {"FROM_BODY": "b"}}
    sid = await create_episode(http, body, **{"X-Secrets": header})
    secret = (await call(http, sid, "secret", {})).result()["output"]["blocks"][0]["text"]
    assert secret == "secret:['FROM_BODY', 'FROM_HEADER', 'PLAIN']"


async def test_a_bad_secrets_header_is_a_422_without_values(http: aiohttp.ClientSession) -> None:
    sid = await new_session_id(http)
    for header in ("not base64!", base64.b64encode(b'{"K": {"value": 5}}').decode()):
        async with http.post("/create", json={"split": "train", "index": 0}, headers={"X-Session-ID": sid, "X-Secrets": header}) as response:
            assert response.status == 422
            assert "X-Secrets" in (await response.json())["detail"]


# ----------------------------------------------------------------------------
# Tool calls over SSE
# ----------------------------------------------------------------------------


async def test_a_50kb_result_is_chunked(http: aiohttp.ClientSession) -> None:
    sid = await create_episode(http, {"split": "train", "index": 0})
    stream = await call(http, sid, "big", {"chars": 50_000})
    payload = "".join(data for name, data in stream.events[1:])
    assert stream.names() == ["task_id"] + ["chunk"] * (len(payload) // 4096) + ["end"]
    assert all(len(data) == 4096 for name, data in stream.events if name == "chunk")
    assert stream.result()["output"]["blocks"][0]["text"] == "x" * 50_000


async def test_an_8mib_image_through_call(http: aiohttp.ClientSession) -> None:
    size = 8 * 1024 * 1024
    sid = await create_episode(http, {"split": "train", "index": 0})
    block = (await call(http, sid, "image", {"size": size})).result()["output"]["blocks"][0]
    assert list(block) == ["data", "mimeType", "detail", "type"]
    assert (block["mimeType"], block["detail"], block["type"]) == ("image/png", {"size": size}, "image")
    assert base64.b64decode(block["data"]) == bytes(i % 256 for i in range(size))


async def test_reconnect_by_task_id_attaches_to_the_running_call(http: aiohttp.ClientSession) -> None:
    sid = await create_episode(http, {"split": "train", "index": 0})
    body = {"name": "sleep", "input": {"seconds": 1.0}}
    async with http.post("/echoenv/call", json=body, headers={"X-Session-ID": sid}) as response:
        line = await response.content.readline()
        assert line == b"event: task_id\n"
        task_id = (await response.content.readline()).decode().removeprefix("data: ").strip()
        response.close()  # drop the stream while the tool runs
    again = await call(http, sid, "sleep", {"seconds": 1.0}, task_id=task_id)
    assert again.data("task_id") == task_id
    assert again.result()["output"]["blocks"][0]["text"] == "slept"


async def test_reconnect_gets_the_result_without_running_the_tool_again(http: aiohttp.ClientSession) -> None:
    sid = await create_episode(http, {"split": "train", "index": 0})
    async with http.post("/echoenv/call", json={"name": "submit", "input": {"answer": "hello"}}, headers={"X-Session-ID": sid}) as response:
        await response.content.readline()
        task_id = (await response.content.readline()).decode().removeprefix("data: ").strip()
        response.close()
    # A second run would be refused ("episode finished"); the attach gets the first run's result.
    again = await call(http, sid, "submit", {"answer": "hello"}, task_id=task_id)
    assert again.data("task_id") == task_id
    assert again.result()["output"]["reward"] == 1.0
    assert (await call(http, sid, "submit", {"answer": "hello"})).result() == {
        "ok": False, "error": EPISODE_FINISHED.format(name="submit"), "reason": "episode_finished"}


async def test_an_unknown_task_id_is_an_sse_error(http: aiohttp.ClientSession) -> None:
    sid = await create_episode(http, {"split": "train", "index": 0})
    stream = await call(http, sid, "echo", {"text": "x"}, task_id="0" * 32)
    assert stream.events == [("error", "unknown task_id")]


async def test_a_long_tool_call_gets_keepalive_comments(http: aiohttp.ClientSession) -> None:
    sid = await create_episode(http, {"split": "train", "index": 0})
    stream = await call(http, sid, "sleep", {"seconds": 12})
    assert "ping" in stream.comments
    assert stream.result()["output"]["blocks"][0]["text"] == "slept"


async def test_50_concurrent_episodes(http: aiohttp.ClientSession) -> None:
    async def episode(index: int) -> float:
        sid = await create_episode(http, {"split": "train", "index": index % 3})
        assert (await call(http, sid, "add", {"a": index, "b": 1})).result()["output"]["blocks"][0]["text"] == str(index + 1)
        answer = TRAIN_TASKS[index % 3]["answer"]
        reward = (await call(http, sid, "submit", {"answer": answer})).result()["output"]["reward"]
        async with http.post("/delete", headers={"X-Session-ID": sid}) as response:
            assert response.status == 200
        return reward

    assert await asyncio.gather(*(episode(i) for i in range(50))) == [1.0] * 50


# ----------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------

BODY_ROUTES = [
    "/echoenv/tasks", "/echoenv/num_tasks", "/echoenv/task", "/echoenv/get_task",
    "/echoenv/task_range", "/echoenv/get_task_range", "/create", "/echoenv/call",
]
MALFORMED = [
    (b"{not json", "not valid JSON", 422),
    (b"", "required", 422),
    (b"[1, 2]", "must be a JSON object", 422),
    (b'"text"', "must be a JSON object", 422),
    (b"\xff\xfe", "not valid JSON", 422),
    (b'{"split": 5, "index": "x", "start": [], "name": 1, "input": 2, "task_spec": 3}', ":", 422),
    # Over the JSON depth limit: 400, as gRPC's ERROR_REASON_JSON_LIMIT.
    (b"[" * 100_000, "JSON value may nest at most", 400),
]


@pytest.mark.parametrize("path", BODY_ROUTES)
async def test_malformed_bodies_are_4xx_with_a_detail(http: aiohttp.ClientSession, path: str) -> None:
    sid = await create_episode(http, {"split": "train", "index": 0})
    for body, expected, status in MALFORMED:
        headers = {"X-Session-ID": sid, "Content-Type": "application/json"}
        async with http.post(path, data=body, headers=headers) as response:
            assert response.status == status, (path, body[:20])
            assert expected in (await response.json())["detail"]


async def test_bodiless_post_routes_ignore_malformed_bodies(http: aiohttp.ClientSession) -> None:
    sid = await create_episode(http, {"split": "train", "index": 0})
    for path in ("/create_session", "/ping", "/delete", "/delete_session"):
        async with http.post(path, data=b"{not json", headers={"X-Session-ID": sid}) as response:
            assert response.status == 200, path


async def test_wrong_field_types_name_the_field(http: aiohttp.ClientSession) -> None:
    async with http.post("/echoenv/task", json={"split": "train", "index": "one"}) as response:
        assert response.status == 422
        assert (await response.json())["detail"].startswith("index:")


async def test_oversized_bodies_get_413_naming_the_limit(serve: ServeProcess) -> None:
    limit = DEFAULT_MAX_MESSAGE_BYTES
    big = b'{"split": "' + b"x" * limit + b'"}'

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: refused once the limit is read
        for start in range(0, len(big), 1 << 20):
            yield big[start:start + (1 << 20)]

    async with aiohttp.ClientSession(base_url=serve.http_url) as http:
        async with http.post("/echoenv/tasks", data=big) as response:
            assert (response.status, await response.json()) == (413, {"detail": (
                f"Request Entity Too Large: the request body is {len(big)} bytes, "
                f"over the server's body limit of {limit} bytes")})
        async with http.post("/echoenv/tasks", data=chunked()) as response:
            assert (response.status, await response.json()) == (413, {"detail": (
                f"Request Entity Too Large: the request body is over the server's body limit of {limit} bytes")})


async def test_unknown_routes_and_methods_answer_json(http: aiohttp.ClientSession) -> None:
    async with http.get("/echoenv/nothing") as response:
        assert (response.status, await response.json()) == (404, {"detail": "Not Found"})
    async with http.put("/health") as response:
        assert (response.status, await response.json()) == (405, {"detail": "Method Not Allowed"})


def test_sse_parser_joins_multiline_data() -> None:
    stream = parse_sse("event: end\ndata: a\ndata: b\n\n: ping\n\n")
    assert stream.events == [("end", "a\nb")] and stream.comments == ["ping"]
