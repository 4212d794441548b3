"""One episode's calls through either door of an `ors-grpc serve --http-port`,
for tests that run one scenario through both: `GrpcDoor` (stubs) and
`HttpDoor` (raw aiohttp on the embedded HTTP door). Each door checks an
error the way its clients see it: gRPC by code, `ors-error-reason` trailer
and `ErrorInfo` metadata; HTTP by status and `{"detail"}` (the reason's
message, which names the cause; HTTP bodies carry no reason field)."""

from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator, NamedTuple, Optional, Protocol

import aiohttp
import grpc
from google.rpc import error_details_pb2, status_pb2

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc.protocol.constants import ERROR_REASON_METADATA_KEY, STATUS_DETAILS_METADATA_KEY
from ors_grpc.protocol.errors import ORSError, REASONS
from tests.support.bridge_http import read_sse
from tests.support.reliability_helpers import grpc_call, grpc_episode, grpc_stub, http_episode
from tests.support.servers import ServeProcess

DOOR_NAMES = ("grpc", "http")
_STARTING = errors_pb2.ERROR_REASON_ENVIRONMENT_STARTING


class Answer(NamedTuple):
    """How a tool call ended: its result (first block's text, metadata) or its failure's text."""

    text: str = ""
    metadata: dict[str, Any] = {}
    failure: str = ""


class EpisodeDoor(Protocol):
    """What a fault test does with an episode, through one door."""

    name: str

    async def create(self, tag: str) -> str:
        """A new episode of `env_name` on the task `{"tag": tag}`; its session id."""

    async def call(self, sid: str, tool: str) -> Answer:
        """Run `tool` (no input) to its end."""

    async def prompt_refused(self, sid: str) -> bool:
        """Whether the episode's prompt is refused now (its process is gone)."""

    async def expect_refused(self, sid: str, expected: ORSError) -> None:
        """Assert the episode's prompt is refused with `expected`, as this door translates it."""

    async def expect_call_answered(self, sid: str, tool: str, expected: ORSError) -> None:
        """Run `tool` and assert the call ends with the status `expected`, as this door
        translates it (HTTP: a status before the first byte, an `error` event with its reason after)."""

    async def try_create(self, tag: str) -> Optional[str]:
        """`create`, or None when it is refused to be retried later (ENVIRONMENT_STARTING: no process is up)."""

    async def delete(self, sid: str) -> None:
        """End the episode."""


class GrpcDoor:
    name = "grpc"

    def __init__(self, stub: Any, env_name: str) -> None:
        self._stub, self._env_name = stub, env_name

    async def create(self, tag: str) -> str:
        return await grpc_episode(self._stub, tag, env_name=self._env_name)

    async def call(self, sid: str, tool: str) -> Answer:
        last = (await grpc_call(self._stub, sid, tool))[-1]
        if last.HasField("failure"):
            return Answer(failure=last.failure.message)
        output = last.result.output
        text = output.blocks[0].text.text if output.blocks else ""
        return Answer(text=text, metadata=json.loads(output.metadata.json or "{}"))

    async def prompt_refused(self, sid: str) -> bool:
        try:
            await self._stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
        except grpc.aio.AioRpcError:
            return True
        return False

    async def expect_refused(self, sid: str, expected: ORSError) -> None:
        self._check(await self._rpc_error(self._stub.GetPrompt(pb.GetPromptRequest(session_id=sid))), expected)

    async def expect_call_answered(self, sid: str, tool: str, expected: ORSError) -> None:
        self._check(await self._rpc_error(grpc_call(self._stub, sid, tool)), expected)

    @staticmethod
    def _check(error: grpc.aio.AioRpcError, expected: ORSError) -> None:
        assert error.code() == expected.code, error
        assert error.details() == expected.message, error.details()
        trailers = dict(error.trailing_metadata() or ())
        reason = errors_pb2.ErrorReason.Name(expected.reason)
        assert trailers[ERROR_REASON_METADATA_KEY] == reason
        info = error_details_pb2.ErrorInfo()
        assert status_pb2.Status.FromString(trailers[STATUS_DETAILS_METADATA_KEY]).details[0].Unpack(info)
        assert (info.reason, dict(info.metadata)) == (reason, expected.metadata)

    async def try_create(self, tag: str) -> Optional[str]:
        try:
            return await self.create(tag)
        except grpc.aio.AioRpcError as error:
            assert error.code() == REASONS[_STARTING].code, error
            assert dict(error.trailing_metadata() or ())[ERROR_REASON_METADATA_KEY] == errors_pb2.ErrorReason.Name(
                _STARTING)
            return None

    async def delete(self, sid: str) -> None:
        await self._stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))

    @staticmethod
    async def _rpc_error(call: Any) -> grpc.aio.AioRpcError:
        try:
            await call
        except grpc.aio.AioRpcError as error:
            return error
        raise AssertionError("the call succeeded")


class HttpDoor:
    name = "http"

    def __init__(self, http: aiohttp.ClientSession, env_name: str) -> None:
        self._http, self._env_name = http, env_name

    async def create(self, tag: str) -> str:
        return await http_episode(self._http, tag, env_name=self._env_name)

    async def call(self, sid: str, tool: str) -> Answer:
        body = {"name": tool, "input": {}}
        async with self._http.post(f"/{self._env_name}/call", json=body, headers={"X-Session-ID": sid}) as response:
            assert response.status == 200, await response.text()
            stream = await read_sse(response)
        if "error" in stream.names():
            return Answer(failure=stream.data("error"))
        output = stream.result()["output"]
        text = output["blocks"][0]["text"] if output["blocks"] else ""
        return Answer(text=text, metadata=output.get("metadata") or {})

    async def prompt_refused(self, sid: str) -> bool:
        async with self._http.get(f"/{self._env_name}/prompt", headers={"X-Session-ID": sid}) as response:
            return response.status != 200

    async def expect_refused(self, sid: str, expected: ORSError) -> None:
        async with self._http.get(f"/{self._env_name}/prompt", headers={"X-Session-ID": sid}) as response:
            assert response.status == REASONS[expected.reason].http_status, await response.text()
            body = await response.json()
            assert body == {"detail": expected.message}, body
            assert "Retry-After" not in response.headers  # the call may have run: nothing retries it

    async def expect_call_answered(self, sid: str, tool: str, expected: ORSError) -> None:
        body = {"name": tool, "input": {}}
        async with self._http.post(f"/{self._env_name}/call", json=body, headers={"X-Session-ID": sid}) as response:
            if response.status != 200:  # answered before the first byte
                assert response.status == REASONS[expected.reason].http_status, await response.text()
                assert await response.json() == {"detail": expected.message}
                return
            stream = await read_sse(response)
        assert stream.names() == ["task_id", "error"], stream
        assert stream.data("error") == expected.message
        assert stream.reasons["error"] == errors_pb2.ErrorReason.Name(expected.reason)

    async def try_create(self, tag: str) -> Optional[str]:
        async with self._http.post("/create_session") as response:
            sid = (await response.json())["sid"]
        body = {"env_name": self._env_name, "task_spec": {"tag": tag, "answer": "yes"}}
        async with self._http.post("/create", json=body, headers={"X-Session-ID": sid}) as response:
            if response.status == 200:
                return sid
            assert response.status == REASONS[_STARTING].http_status, await response.text()
            assert response.headers["X-Backend-State"] == "starting" and "Retry-After" in response.headers
            return None

    async def delete(self, sid: str) -> None:
        async with self._http.post("/delete", headers={"X-Session-ID": sid}) as response:
            assert response.status == 200, await response.text()


@contextlib.asynccontextmanager
async def episode_door(name: str, serve: ServeProcess, env_name: str) -> AsyncIterator[EpisodeDoor]:
    """The door called `name` ("grpc" or "http") of `serve` (started with `--http-port`)."""
    if name == "grpc":
        async with grpc_stub(serve.grpc_target) as stub:
            yield GrpcDoor(stub, env_name)
    else:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http:
            yield HttpDoor(http, env_name)
