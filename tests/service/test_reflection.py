"""Reflection serves the error model: a refused call's `grpc-status-details-bin`
(a `google.rpc.Status` whose details are `Any`s) decodes with nothing but the
types reflection serves, on v1 and v1alpha, as grpcurl, grpcui and Postman
decode it; and grpcurl itself prints the details' fields (when installed)."""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

import grpc
import pytest
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.server import create_server
from tests.support.environments import EchoEnv
from tests.support.grpc_calls import expect_error
from tests.support.tooling import grpcurl

STATUS_DETAILS_KEY = "grpc-status-details-bin"
GRPCURL_TIMEOUT_S = 60


@pytest.fixture
async def port() -> AsyncIterator[int]:
    server, port = await create_server([EchoEnv], "127.0.0.1:0")
    try:
        yield port
    finally:
        await server.stop(None)


async def refused_call_details(port: int) -> bytes:
    """The `grpc-status-details-bin` of a real refusal: ListSplits of an unknown environment."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        error = await expect_error(pb_grpc.EnvironmentServiceStub(channel).ListSplits(
            pb.ListSplitsRequest(env_name="nope")))
    return dict(error.trailing_metadata())[STATUS_DETAILS_KEY]


async def reflected_pool(port: int, version: str, *symbols: str) -> descriptor_pool.DescriptorPool:
    """A pool of only what the server's reflection (`version`) serves for `symbols`,
    each asked for as `file_containing_symbol`, the way grpcurl resolves a type."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        info = channel.stream_stream(
            f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        requests = [reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol) for symbol in symbols]
        replies = [reply async for reply in info(iter(requests))]
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for symbol, reply in zip(symbols, replies):
        assert reply.WhichOneof("message_response") == "file_descriptor_response", (symbol, reply.error_response)
        for data in reply.file_descriptor_response.file_descriptor_proto:
            file = descriptor_pb2.FileDescriptorProto.FromString(data)
            files[file.name] = file
    pool = descriptor_pool.DescriptorPool()
    while files:  # each file after the files it imports
        ready = [name for name, file in files.items() if not set(file.dependency) & set(files)]
        assert ready, f"reflection served files whose imports it did not serve: {sorted(files)}"
        for name in ready:
            pool.Add(files.pop(name))
    return pool


def message_class(pool: descriptor_pool.DescriptorPool, full_name: str) -> type:
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
async def test_an_errors_details_decode_with_the_types_reflection_serves(port: int, version: str) -> None:
    details = await refused_call_details(port)
    status_pool = await reflected_pool(port, version, "google.rpc.Status")
    status = message_class(status_pool, "google.rpc.Status").FromString(details)
    assert status.code == grpc.StatusCode.NOT_FOUND.value[0]
    (detail,) = status.details
    assert detail.type_url == "type.googleapis.com/google.rpc.ErrorInfo"
    type_name = detail.type_url.rpartition("/")[2]
    info = message_class(await reflected_pool(port, version, type_name), type_name)()
    assert any_pb2.Any(type_url=detail.type_url, value=detail.value).Unpack(info)
    assert (info.domain, info.reason) == ("ors.v1", "ERROR_REASON_UNKNOWN_ENVIRONMENT")


async def run_grpcurl(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        grpcurl(), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), GRPCURL_TIMEOUT_S)
    return process.returncode, stdout.decode(), stderr.decode()


async def test_grpcurl_prints_a_refused_calls_error_info(port: int) -> None:
    code, out, err = await run_grpcurl(
        "-plaintext", "-format-error", "-d", json.dumps({"env_name": "nope"}),
        f"127.0.0.1:{port}", "ors.v1.EnvironmentService/ListSplits",
    )
    assert code != 0 and "not recognized" not in err, err
    status = json.loads(err)  # -format-error: the status as JSON, on stderr
    assert status["code"] == grpc.StatusCode.NOT_FOUND.value[0], err
    (detail,) = status["details"]
    assert detail == {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "domain": "ors.v1",
                      "reason": "ERROR_REASON_UNKNOWN_ENVIRONMENT"}, err


@pytest.mark.parametrize("symbol", ["google.rpc.Status", "google.rpc.ErrorInfo"])
async def test_grpcurl_describes_the_error_models_types(port: int, symbol: str) -> None:
    code, out, err = await run_grpcurl("-plaintext", f"127.0.0.1:{port}", "describe", symbol)
    assert code == 0, out + err
    assert out.startswith(f"{symbol} is a message:"), out
