"""The server around the service: API key, grpc.health.v1, reflection, TLS, message size."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.server import ServerConfig, create_server
from tests.support.grpc_calls import call_tool, create_episode, error_reason, expect_error, serving, tool_call
from tests.support.environments import EchoEnv
from tests.support.tooling import make_self_signed_certificate

API_KEY = "test-api-key"


async def test_api_key_is_required_except_for_health() -> None:
    async with serving([EchoEnv], ServerConfig(api_key=API_KEY)) as stub:
        good = (("x-api-key", API_KEY),)
        for metadata in [(), (("x-api-key", "wrong"),), (("x-api-key", API_KEY + "x"),)]:
            for call in [
                stub.ListEnvironments(pb.ListEnvironmentsRequest(), metadata=metadata),
                stub.CreateSessionId(pb.CreateSessionIdRequest(), metadata=metadata),
                stub.CallTool(pb.CallToolRequest(session_id="s", call=tool_call("echo")), metadata=metadata),
            ]:
                error = await expect_error(call)
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED
                assert error_reason(error) == "ERROR_REASON_UNAUTHENTICATED"
                assert API_KEY not in error.details()
        assert (await stub.Health(pb.HealthRequest())).status == "ok"
        names = await stub.ListEnvironments(pb.ListEnvironmentsRequest(), metadata=good)
        assert list(names.names) == ["echoenv"]
        sid = (await stub.CreateSessionId(pb.CreateSessionIdRequest(), metadata=good)).session_id
        request = pb.CreateEpisodeRequest(session_id=sid, task_index=pb.TaskIndex(split="train"))
        await stub.CreateEpisode(request, metadata=good)
        events = [e async for e in stub.CallTool(
            pb.CallToolRequest(session_id=sid, call=tool_call("echo", {"text": "k"})), metadata=good)]
        assert events[1].result.output.blocks[0].text.text == "k"


async def test_grpc_health_service_is_serving_without_api_key() -> None:
    server, port = await create_server([EchoEnv], config=ServerConfig(api_key=API_KEY))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ["", "ors.v1.EnvironmentService"]:
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(None)


async def test_reflection_lists_the_services() -> None:
    server, port = await create_server([EchoEnv])
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            requests = [reflection_pb2.ServerReflectionRequest(list_services="")]
            replies = [r async for r in reflection.ServerReflectionInfo(iter(requests))]
            names = {s.name for s in replies[0].list_services_response.service}
            assert {"ors.v1.EnvironmentService", "grpc.health.v1.Health"} <= names
    finally:
        await server.stop(None)


def _reflected(port: int) -> ProtoReflectionDescriptorDatabase:
    """grpcio-reflection's client database (a real reflection client) onto the server."""
    return ProtoReflectionDescriptorDatabase(grpc.insecure_channel(f"127.0.0.1:{port}"))


async def test_reflection_describes_a_method_with_the_contracts_comments() -> None:
    """What `grpcurl describe ors.v1.EnvironmentService.CallTool` needs: the
    method name resolves to its file, served with its comments."""
    server, port = await create_server([EchoEnv])
    try:
        def describe() -> tuple[str, str, list[str]]:
            database = _reflected(port)
            method = DescriptorPool(database).FindMethodByName("ors.v1.EnvironmentService.CallTool")
            file = database.FindFileContainingSymbol("ors.v1.EnvironmentService.CallTool")
            comments = [location.leading_comments for location in file.source_code_info.location]
            return method.input_type.full_name, file.name, comments

        input_type, file_name, comments = await asyncio.to_thread(describe)
        assert (input_type, file_name) == ("ors.v1.CallToolRequest", "ors/v1/environment_service.proto")
        assert any("task id" in comment for comment in comments)
    finally:
        await server.stop(None)


async def test_reflection_answers_on_v1_and_v1alpha() -> None:
    server, port = await create_server([EchoEnv])
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for version in ("v1", "v1alpha"):
                info = channel.stream_stream(
                    f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                    request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                    response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
                )
                requests = [
                    reflection_pb2.ServerReflectionRequest(list_services=""),
                    reflection_pb2.ServerReflectionRequest(file_containing_symbol="ors.v1.EnvironmentService.Nope"),
                    reflection_pb2.ServerReflectionRequest(
                        file_containing_symbol=f"grpc.reflection.{version}.ServerReflection"),
                ]
                listed, missing, itself = [reply async for reply in info(iter(requests))]
                assert {s.name for s in listed.list_services_response.service} == {
                    "ors.v1.EnvironmentService", "grpc.health.v1.Health",
                    "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"}
                assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
                (file,) = itself.file_descriptor_response.file_descriptor_proto
                assert descriptor_pb2.FileDescriptorProto.FromString(file).package == f"grpc.reflection.{version}"
    finally:
        await server.stop(None)


async def test_max_message_size_is_configurable() -> None:
    config = ServerConfig(max_message_bytes=64 * 1024)
    async with serving([EchoEnv], config) as stub:
        sid = await create_episode(stub)
        _, event = await call_tool(stub, sid, "big", {"chars": 32 * 1024})
        assert len(event.result.output.blocks[0].text.text) == 32 * 1024
        request = pb.CallToolRequest(session_id=sid, call=tool_call("big", {"chars": 128 * 1024}))
        error = await expect_error(stub.CallTool(request))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost, made with the openssl command."""
    return make_self_signed_certificate(tmp_path_factory.mktemp("tls"))


async def test_tls_from_certificate_files(tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    server, port = await create_server([EchoEnv], config=ServerConfig(tls_cert=str(cert), tls_key=str(key)))
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            assert (await stub.Health(pb.HealthRequest())).status == "ok"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as plaintext:
            error = await expect_error(pb_grpc.EnvironmentServiceStub(plaintext).Health(
                pb.HealthRequest(), timeout=5))
            assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        await server.stop(None)


async def test_tls_needs_both_files(tls_files: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="both"):
        await create_server([EchoEnv], config=ServerConfig(tls_cert=str(tls_files[0])))
