"""Exactly-once tool calls and group scorings: an idempotency key (HTTP
`Idempotency-Key`, gRPC `CallToolRequest`/`ScoreGroupRequest.idempotency_key`)
becomes the call's task id, so a retried request attaches to the first run
instead of starting a second.

The probe environments count each tool's runs and each scoring per session
(`stats`), the side effect that must happen once. Connections are cut with raw sockets:
after the whole request (before reading anything) and after the headers only.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Iterator
from urllib.parse import urlsplit

import aiohttp
import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import types_pb2
from tests.support.bridge_http import read_sse
from tests.support.grpc_calls import error_reason
from tests.support.reliability_helpers import (
    PROBE_ENVIRONMENTS,
    eventually,
    grpc_call_request,
    grpc_episode,
    grpc_stats,
    grpc_stub,
    http_episode,
    http_stats,
)
from tests.support.servers import ServeProcess, start_serve

#: The probe environment with `score_group` (its scorings count as runs of `score_group`).
SCORING_ENV = "scoringprobeenv"
SCORE_GROUP_PATH = f"/{SCORING_ENV}/score_group"


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with start_serve(*PROBE_ENVIRONMENTS, "tests.support.reliability_environments:ScoringProbeEnv",
                     "--http-port", "0") as serve:
        yield serve


async def keyed_post(http: aiohttp.ClientSession, sid: str, key: str, path: str, body: dict) -> tuple[int, object]:
    """POST with an Idempotency-Key: the status and (200) the SSE events or (else) the JSON body."""
    headers = {"X-Session-ID": sid, "Idempotency-Key": key}
    async with http.post(path, json=body, headers=headers) as response:
        if response.status != 200:
            return response.status, await response.json()
        return 200, await read_sse(response)


async def keyed_call(http: aiohttp.ClientSession, sid: str, key: str, name: str, tool_input: dict) -> tuple[int, object]:
    """POST /call with an Idempotency-Key (as `keyed_post`)."""
    return await keyed_post(http, sid, key, "/probeenv/call", {"name": name, "input": tool_input})


def scoring_body(*answers: str, seconds: float = 0.0) -> dict:
    """A /score_group body: one candidate per answer; the scoring sleeps `seconds`."""
    return {"candidates": [
        {"messages": [{"role": "assistant", "blocks": [{"type": "text", "text": answer}]}],
         "metadata": {"seconds": seconds}}
        for answer in answers
    ]}


async def started(http: aiohttp.ClientSession, sid: str) -> bool:
    return (await http_stats(http, sid))["runs"] == {"slow": 1}


def raw_call_then_cut(
    http_url: str, sid: str, key: str, body: dict, *, send_body: bool, path: str = "/probeenv/call"
) -> None:
    """Send a POST (/call by default) over a raw socket and close it at once,
    reading nothing; `send_body=False` cuts it after the headers (the body never arrives)."""
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {urlsplit(http_url).netloc}\r\n"
        f"Content-Type: application/json\r\nX-Session-ID: {sid}\r\nIdempotency-Key: {key}\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    address = urlsplit(http_url)
    with socket.create_connection((address.hostname, address.port)) as raw:
        raw.sendall(head + payload if send_body else head)


@pytest.mark.parametrize("send_body", [True, False], ids=["cut-after-request", "cut-after-headers"])
async def test_a_call_cut_before_its_task_id_and_retried_with_its_key_runs_once_http(serve, send_body):
    async with aiohttp.ClientSession(serve.http_url) as http:
        sid = await http_episode(http, f"cut-{send_body}")
        slow = {"name": "slow", "input": {"seconds": 0.5}}
        await asyncio.to_thread(raw_call_then_cut, serve.http_url, sid, "key-1", slow, send_body=send_body)
        if send_body:  # the bridge got the whole request: the tool runs, though the client never saw its task id
            await eventually(lambda: started(http, sid), "the cut call to start")
        status, stream = await keyed_call(http, sid, "key-1", "slow", {"seconds": 0.5})
        assert status == 200, stream
        assert stream.data("task_id") == "key-1"
        assert stream.result()["output"]["blocks"][0]["text"] == "slow run 1"
        # After the result too: the same answer, no second run.
        status, again = await keyed_call(http, sid, "key-1", "slow", {"seconds": 0.5})
        assert (status, again.events) == (200, stream.events)
        assert (await http_stats(http, sid))["runs"] == {"slow": 1}


async def test_a_key_reused_with_another_tool_or_input_is_422_and_keys_are_per_session_http(serve):
    async with aiohttp.ClientSession(serve.http_url) as http:
        sid = await http_episode(http, "reuse")
        status, _ = await keyed_call(http, sid, "key-2", "slow", {"seconds": 0.01})
        assert status == 200
        for name, tool_input in (("slow", {"seconds": 0.02}), ("echo_tag", {})):
            status, body = await keyed_call(http, sid, "key-2", name, tool_input)
            assert status == 422
            assert "idempotency key" in body["detail"]
        # A quoted key (the IETF draft's form) is the same key.
        status, stream = await keyed_call(http, sid, '"key-2"', "slow", {"seconds": 0.01})
        assert status == 200 and stream.data("task_id") == "key-2"
        other = await http_episode(http, "reuse-other")
        status, stream = await keyed_call(http, other, "key-2", "echo_tag", {})
        assert status == 200 and stream.result()["output"]["blocks"][0]["text"] == "reuse-other"
        assert (await http_stats(http, sid))["runs"] == {"slow": 1}
        assert (await http_stats(http, other))["runs"] == {"echo_tag": 1}
        status, body = await keyed_call(http, sid, "x" * 129, "slow", {"seconds": 0.01})
        assert status == 422


async def test_a_call_cut_before_its_task_id_and_retried_with_its_key_runs_once_grpc(serve):
    async with grpc_stub(serve.grpc_target) as stub:
        sid = await grpc_episode(stub, "cut-grpc")
        request = grpc_call_request(sid, "slow", {"seconds": 0.5})
        request.idempotency_key = "key-3"
        first = stub.CallTool(request)
        first.cancel()  # before reading anything
        events = [event async for event in stub.CallTool(request)]
        assert [event.WhichOneof("event") for event in events] == ["task_id", "result"]
        assert events[0].task_id == "key-3"
        assert events[1].result.output.blocks[0].text.text == "slow run 1"
        again = [event async for event in stub.CallTool(request)]
        assert again == events
        assert (await grpc_stats(stub, sid))["runs"] == {"slow": 1}

        reused = grpc_call_request(sid, "slow", {"seconds": 0.1})
        reused.idempotency_key = "key-3"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.CallTool(reused):
                pass
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_reason(refused.value) == "ERROR_REASON_IDEMPOTENCY_KEY_REUSED"
        with_task_id = grpc_call_request(sid, "slow", {"seconds": 0.5}, task_id="key-3")
        with_task_id.idempotency_key = "key-3"
        with pytest.raises(grpc.aio.AioRpcError) as both:
            async for _ in stub.CallTool(with_task_id):
                pass
        assert error_reason(both.value) == "ERROR_REASON_INVALID_REQUEST"
        # The task id of a keyed call attaches as any task id does.
        attached = [event async for event in stub.CallTool(grpc_call_request(sid, "slow", task_id="key-3"))]
        assert attached == events
        assert (await grpc_stats(stub, sid))["runs"] == {"slow": 1}


# Group scorings (ScoreGroup, POST /{env}/score_group) ---------------------------


async def scored(http: aiohttp.ClientSession, sid: str) -> bool:
    return (await http_stats(http, sid))["runs"] == {"score_group": 1}


def rewards(stream) -> list[float]:
    return [score["reward"] for score in stream.result()["scores"]]


@pytest.mark.parametrize("send_body", [True, False], ids=["cut-after-request", "cut-after-headers"])
async def test_a_scoring_cut_before_its_task_id_and_retried_with_its_key_scores_once_http(serve, send_body):
    async with aiohttp.ClientSession(serve.http_url) as http:
        sid = await http_episode(http, f"score-cut-{send_body}", env_name=SCORING_ENV)
        body = scoring_body("yes", "no", seconds=0.5)
        await asyncio.to_thread(raw_call_then_cut, serve.http_url, sid, "score-1", body,
                                send_body=send_body, path=SCORE_GROUP_PATH)
        if send_body:  # the bridge got the whole request: the scoring runs, unseen by the client
            await eventually(lambda: scored(http, sid), "the cut scoring to start")
        status, stream = await keyed_post(http, sid, "score-1", SCORE_GROUP_PATH, body)
        assert status == 200, stream
        assert stream.data("task_id") == "score-1"
        assert rewards(stream) == [1.0, 1.0]  # both scored by the first run
        # After the result too: the same answer, no second scoring.
        status, again = await keyed_post(http, sid, "score-1", SCORE_GROUP_PATH, body)
        assert (status, again.events) == (200, stream.events)
        assert (await http_stats(http, sid))["runs"] == {"score_group": 1}


async def test_a_scoring_key_reused_with_other_candidates_or_by_a_tool_call_is_422_http(serve):
    async with aiohttp.ClientSession(serve.http_url) as http:
        sid = await http_episode(http, "score-reuse", env_name=SCORING_ENV)
        status, _ = await keyed_post(http, sid, "score-2", SCORE_GROUP_PATH, scoring_body("yes"))
        assert status == 200
        for body in (scoring_body("no"), scoring_body("yes", "yes"), scoring_body("yes", seconds=0.01)):
            status, refused = await keyed_post(http, sid, "score-2", SCORE_GROUP_PATH, body)
            assert status == 422
            assert "idempotency key" in refused["detail"]
        # Tool calls and scorings share the session's keys, each bound to its kind.
        status, refused = await keyed_call(http, sid, "score-2", "echo_tag", {})
        assert status == 422 and "idempotency key" in refused["detail"]
        status, _ = await keyed_call(http, sid, "call-2", "echo_tag", {})
        assert status == 200
        status, refused = await keyed_post(http, sid, "call-2", SCORE_GROUP_PATH, scoring_body("yes"))
        assert status == 422 and "idempotency key" in refused["detail"]
        # A quoted key is the same key; and it still answers the first scoring.
        status, stream = await keyed_post(http, sid, '"score-2"', SCORE_GROUP_PATH, scoring_body("yes"))
        assert status == 200 and stream.data("task_id") == "score-2" and rewards(stream) == [1.0]
        assert (await http_stats(http, sid))["runs"] == {"score_group": 1, "echo_tag": 1}


def grpc_scoring_request(sid: str, *answers: str, seconds: float = 0.0) -> pb.ScoreGroupRequest:
    request = pb.ScoreGroupRequest(session_id=sid)
    for answer in answers:
        candidate = request.candidates.add()
        candidate.messages.append(types_pb2.Message(
            role=types_pb2.MESSAGE_ROLE_ASSISTANT,
            blocks=[types_pb2.MessageBlock(text=types_pb2.TextBlock(text=answer))],
        ))
        candidate.metadata.json = json.dumps({"seconds": seconds})
    return request


async def refusal_reason(stream) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async for _ in stream:
            pass
    return error_reason(refused.value)


async def test_a_scoring_cut_before_its_task_id_and_retried_with_its_key_scores_once_grpc(serve):
    async with grpc_stub(serve.grpc_target) as stub:
        sid = await grpc_episode(stub, "score-cut-grpc", env_name=SCORING_ENV)
        request = grpc_scoring_request(sid, "yes", seconds=0.5)
        request.idempotency_key = "score-3"
        first = stub.ScoreGroup(request)
        first.cancel()  # before reading anything
        events = [event async for event in stub.ScoreGroup(request)]
        assert [event.WhichOneof("event") for event in events] == ["task_id", "result"]
        assert events[0].task_id == "score-3"
        assert [score.reward for score in events[1].result.scores] == [1.0]
        assert [event async for event in stub.ScoreGroup(request)] == events
        assert (await grpc_stats(stub, sid))["runs"] == {"score_group": 1}

        reused = grpc_scoring_request(sid, "no", seconds=0.5)
        reused.idempotency_key = "score-3"
        assert await refusal_reason(stub.ScoreGroup(reused)) == "ERROR_REASON_IDEMPOTENCY_KEY_REUSED"
        by_tool_call = grpc_call_request(sid, "echo_tag")
        by_tool_call.idempotency_key = "score-3"
        assert await refusal_reason(stub.CallTool(by_tool_call)) == "ERROR_REASON_IDEMPOTENCY_KEY_REUSED"
        with_task_id = grpc_scoring_request(sid, "yes", seconds=0.5)
        with_task_id.task_id = with_task_id.idempotency_key = "score-3"
        assert await refusal_reason(stub.ScoreGroup(with_task_id)) == "ERROR_REASON_INVALID_REQUEST"
        # The task id of a keyed scoring attaches as any scoring's task id does.
        attached = [event async for event in stub.ScoreGroup(pb.ScoreGroupRequest(session_id=sid, task_id="score-3"))]
        assert attached == events
        assert (await grpc_stats(stub, sid))["runs"] == {"score_group": 1}


async def test_the_documented_invalid_requests_of_keys_and_candidates_say_what_is_wrong_grpc(serve):
    """The INVALID_REQUEST cases of the proto's comments on the keys and the
    candidates, each with a message that names the field at fault."""
    async with grpc_stub(serve.grpc_target) as stub:
        sid = await grpc_episode(stub, "invalid-keys")
        long_key = grpc_call_request(sid, "slow", {"seconds": 0.01})
        long_key.idempotency_key = "x" * 129
        with_task_id = grpc_call_request(sid, "slow", {"seconds": 0.01}, task_id="t-1")
        with_task_id.idempotency_key = "k-1"
        scoring_sid = await grpc_episode(stub, "invalid-candidates", env_name=SCORING_ENV)
        unspecified_role = pb.ScoreGroupRequest(session_id=scoring_sid)
        unspecified_role.candidates.add().messages.add().blocks.add().text.text = "no role"
        long_scoring_key = pb.ScoreGroupRequest(session_id=scoring_sid, idempotency_key="y" * 129)
        scoring_with_task_id = pb.ScoreGroupRequest(session_id=scoring_sid, idempotency_key="k-2", task_id="t-2")
        cases = [
            (stub.CallTool(long_key), "idempotency_key must be 1 to 128 characters"),
            (stub.CallTool(with_task_id), "give either call.task_id (attach) or idempotency_key, not both"),
            (stub.ScoreGroup(unspecified_role), "candidates: a message has no role"),
            (stub.ScoreGroup(long_scoring_key), "idempotency_key must be 1 to 128 characters"),
            (stub.ScoreGroup(scoring_with_task_id), "give either task_id (attach) or idempotency_key, not both"),
        ]
        for call, message in cases:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in call:
                    pass
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (error_reason(refused.value), refused.value.details()) == ("ERROR_REASON_INVALID_REQUEST", message)
