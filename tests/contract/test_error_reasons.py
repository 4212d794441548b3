"""The one error table: every ErrorReason has its gRPC code and HTTP status,
and ENVIRONMENT_CRASHED (a dead environment process) is worded and mapped so
that no standard client retries a call that may have run; the call in flight
when the process dies answers it too, on every door, never as a tool failure."""

from __future__ import annotations

import signal
from typing import Iterator

import aiohttp
import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc.protocol.constants import STATUS_DETAILS_METADATA_KEY
from ors_grpc.protocol.errors import (
    CRASH_CAUSE_KEY, CRASH_CAUSES, CRASH_EXIT_STATUS_KEY, CRASH_SIGNAL_KEY, REASONS, RETRY_AFTER_S,
    ends_episode, environment_crashed, environment_crashed_from_exitcode, http_status_for, trailing_metadata,
)
from tests.support.bridge_http import parse_sse
from tests.support.servers import ServeProcess, start_serve

CRASHED = errors_pb2.ERROR_REASON_ENVIRONMENT_CRASHED
#: What ors-sdk (every 5xx, 429) and openreward's env-server policy (429, 502, 503, 504) retry.
RETRIED_BY_STANDARD_CLIENTS = {429, *range(500, 600)}


def test_every_reason_has_a_row() -> None:
    missing = [errors_pb2.ErrorReason.Name(value) for value in errors_pb2.ErrorReason.values()
               if value != errors_pb2.ERROR_REASON_UNSPECIFIED and value not in REASONS]
    assert missing == []


def test_a_crashed_environment_is_aborted_410_never_retried_and_without_retry_after() -> None:
    assert (REASONS[CRASHED].code, REASONS[CRASHED].http_status) == (grpc.StatusCode.ABORTED, 410)
    assert http_status_for(grpc.StatusCode.ABORTED, "ERROR_REASON_ENVIRONMENT_CRASHED") == 410
    assert REASONS[CRASHED].http_status not in RETRIED_BY_STANDARD_CLIENTS
    assert CRASHED not in RETRY_AFTER_S
    assert "retry-after" not in dict(trailing_metadata(environment_crashed("stalled")))


def test_only_reasons_that_end_the_episode_are_statuses_after_a_task_id() -> None:
    ending = {errors_pb2.ErrorReason.Name(reason) for reason, row in REASONS.items() if row.ends_episode}
    assert ending == {"ERROR_REASON_SESSION_NOT_FOUND", "ERROR_REASON_SESSION_DELETED", "ERROR_REASON_ENVIRONMENT_CRASHED"}
    assert all(ends_episode(name) for name in ending)
    assert not ends_episode("ERROR_REASON_MESSAGE_TOO_LARGE")
    assert not ends_episode(None) and not ends_episode("") and not ends_episode("ERROR_REASON_NO_SUCH")


@pytest.mark.parametrize("exitcode, cause, message, metadata", [
    (-signal.SIGSEGV, None, "was killed by SIGSEGV", {"cause": "signal", "signal": "SIGSEGV"}),
    (-signal.SIGKILL, None, "was killed by SIGKILL", {"cause": "signal", "signal": "SIGKILL"}),
    (3, None, "exited with status 3", {"cause": "exited", "exit_status": "3"}),
    (-signal.SIGKILL, "tool_timeout", "was killed because a tool call ran on after it was cancelled (a tool timeout, or its caller gone) (SIGKILL)",
     {"cause": "tool_timeout", "signal": "SIGKILL"}),
    (-signal.SIGKILL, "memory_limit", "was killed for going over its memory limit (SIGKILL)",
     {"cause": "memory_limit", "signal": "SIGKILL"}),
    (-signal.SIGKILL, "stalled", "was killed because its event loop stalled (SIGKILL)",
     {"cause": "stalled", "signal": "SIGKILL"}),
], ids=["segfault", "sigkill from outside", "exit status", "tool timeout", "memory limit", "stall"])
def test_a_crash_is_worded_by_its_cause_and_signal_name(exitcode, cause, message, metadata) -> None:
    error = environment_crashed_from_exitcode(exitcode, cause)
    assert error.reason == CRASHED and error.code == grpc.StatusCode.ABORTED
    assert error.message == (f"the environment's worker process {message}; "
                             "the episode's state is lost: start a new episode")
    assert error.metadata == metadata


def test_crash_metadata_keys_and_causes() -> None:
    assert (CRASH_CAUSE_KEY, CRASH_EXIT_STATUS_KEY, CRASH_SIGNAL_KEY) == ("cause", "exit_status", "signal")
    assert CRASH_CAUSES == {"exited", "signal", "tool_timeout", "stalled", "memory_limit"}
    assert environment_crashed("signal", signal_number=200).metadata["signal"] == "signal 200"
    with pytest.raises(ValueError, match="unknown crash cause 'oops'"):
        environment_crashed("oops")


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with start_serve("tests.support.crash_report_env:CrashReportEnv", "--http-port", "0") as process:
        yield process


def _grpc_episode(stub: pb_grpc.EnvironmentServiceStub, sid: str) -> None:
    request = pb.CreateEpisodeRequest(session_id=sid, env_name="crashreportenv")
    request.task_spec.json = "{}"
    stub.CreateEpisode(request, timeout=30)


def test_a_crash_reaches_grpc_as_aborted_with_its_error_info(serve: ServeProcess) -> None:
    with grpc.insecure_channel(serve.grpc_target) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        _grpc_episode(stub, "crashed")
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetPrompt(pb.GetPromptRequest(session_id="crashed"), timeout=30)
        stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id="crashed"), timeout=30)
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert "killed by SIGSEGV" in caught.value.details()
    trailers = dict(caught.value.trailing_metadata())
    status = status_pb2.Status.FromString(trailers[STATUS_DETAILS_METADATA_KEY])
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert info.reason == "ERROR_REASON_ENVIRONMENT_CRASHED"
    assert dict(info.metadata) == {"cause": "signal", "signal": "SIGSEGV"}


async def _http_episode(http: aiohttp.ClientSession) -> dict[str, str]:
    """A new episode of CrashReportEnv over HTTP: the headers of its calls."""
    async with http.post("/create_session") as response:
        headers = {"X-Session-ID": (await response.json())["sid"]}
    async with http.post("/create", json={"env_name": "crashreportenv", "task_spec": {}},
                         headers=headers) as response:
        assert response.status == 200, await response.text()
    return headers


async def test_a_crash_reaches_http_as_410_with_its_message(serve: ServeProcess) -> None:
    async with aiohttp.ClientSession(base_url=serve.http_url) as http:
        headers = await _http_episode(http)
        async with http.get("/crashreportenv/prompt", headers=headers) as response:
            assert response.status == 410
            assert "Retry-After" not in response.headers
            detail = (await response.json())["detail"]
        async with http.post("/delete", headers=headers) as response:
            assert response.status == 200
    assert detail == ("the environment's worker process was killed by SIGSEGV; "
                      "the episode's state is lost: start a new episode")


#: What a call in flight answers when its environment's process dies under it (CrashReportEnv's tools).
CRASHED_IN_FLIGHT = ("the environment's worker process was killed by SIGSEGV; "
                     "the episode's state is lost: start a new episode")


@pytest.mark.parametrize("tool", ["crash_in_flight", "crash_in_flight_later"])
def test_the_call_in_flight_when_its_process_dies_is_aborted_on_call_tool_and_run_episode(
        serve: ServeProcess, tool: str) -> None:
    with grpc.insecure_channel(serve.grpc_target) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        _grpc_episode(stub, f"in-flight-{tool}")
        request = pb.CallToolRequest(session_id=f"in-flight-{tool}", call={"name": tool})
        events = []
        with pytest.raises(grpc.RpcError) as caught:
            for event in stub.CallTool(request, timeout=30):
                events.append(event.WhichOneof("event"))
        assert events == ["task_id"]  # then the status: never a `failure` event
        assert caught.value.code() == grpc.StatusCode.ABORTED
        assert caught.value.details() == CRASHED_IN_FLIGHT
        assert dict(caught.value.trailing_metadata())["ors-error-reason"] == "ERROR_REASON_ENVIRONMENT_CRASHED"

        def steps():
            create = pb.RunEpisodeRequest()
            create.create.env_name = "crashreportenv"
            create.create.task_spec.json = "{}"
            yield create
            call = pb.RunEpisodeRequest()
            call.call_tool.name, call.call_tool.task_id = tool, "in-flight"
            yield call

        answers = list(stub.RunEpisode(steps(), timeout=30))
        assert answers[1].WhichOneof("step") == "error", answers[1]
        error = answers[1].error
        assert (error.code, error.reason, error.message) == (
            grpc.StatusCode.ABORTED.value[0], CRASHED, CRASHED_IN_FLIGHT)


async def test_the_call_in_flight_when_its_process_dies_is_410_before_the_first_byte_and_an_error_with_its_reason_after(
        serve: ServeProcess) -> None:
    async with aiohttp.ClientSession(base_url=serve.http_url) as http:
        headers = await _http_episode(http)
        # At once: nothing was sent yet, so the answer is the status itself.
        async with http.post("/crashreportenv/call", json={"name": "crash_in_flight", "input": {}},
                             headers=headers) as response:
            assert response.status == 410 and "Retry-After" not in response.headers
            assert await response.json() == {"detail": CRASHED_IN_FLIGHT}
        # Later: the stream has begun (task_id), so an `error` event that carries the reason.
        async with http.post("/crashreportenv/call", json={"name": "crash_in_flight_later", "input": {}},
                             headers=headers) as response:
            assert response.status == 200
            stream = parse_sse(await response.text())
        assert stream.names() == ["task_id", "error"]
        assert stream.data("error") == CRASHED_IN_FLIGHT
        assert stream.reasons == {"error": "ERROR_REASON_ENVIRONMENT_CRASHED"}


#: The message limit of the server below: a `blob` of LIMIT_BYTES cannot go out, a small one can.
LIMIT_BYTES = 65536


@pytest.fixture(scope="module")
def small_limit() -> Iterator[ServeProcess]:
    with start_serve("tests.support.reliability_environments:SizesEnv", "--http-port", "0", "--in-process",
                     "--max-message-bytes", str(LIMIT_BYTES)) as process:
        yield process


async def test_an_answer_over_the_limit_is_an_error_event_however_quick_and_the_episode_lives_on(
        small_limit: ServeProcess) -> None:
    """Only a reason that ends the episode is a status after the task id; a call's
    answer over the limit is that call's failure, however quickly it came."""
    async with aiohttp.ClientSession(base_url=small_limit.http_url) as http:
        async with http.post("/create", json={"env_name": "sizesenv", "task_spec": {"tag": "big"}},
                             headers={"X-Session-ID": "big"}) as response:
            assert response.status == 200, await response.text()
        for _ in range(3):  # each in a few ms: the quick path, which answered a 500
            async with http.post("/sizesenv/call", json={"name": "blob", "input": {"size": LIMIT_BYTES}},
                                 headers={"X-Session-ID": "big"}) as response:
                assert response.status == 200, await response.text()
                assert response.headers["Content-Type"] == "text/event-stream"
                stream = parse_sse(await response.text())
            assert stream.names() == ["task_id", "error"]
            assert f"over the server's message limit of {LIMIT_BYTES} bytes" in stream.data("error")
            assert stream.reasons == {"error": "ERROR_REASON_MESSAGE_TOO_LARGE"}
        async with http.post("/sizesenv/call", json={"name": "blob", "input": {"size": 10}},
                             headers={"X-Session-ID": "big"}) as response:
            stream = parse_sse(await response.text())
        assert stream.names() == ["task_id", "end"]
        assert stream.result()["output"]["blocks"][0]["text"] == "x" * 10
