"""gRPC server reflection, v1 and v1alpha, so that generic tools (grpcurl,
Postman, grpcui) can list, describe and call the service.

What grpcio-reflection's servicer lacks, and this one adds: the `v1` service
(it serves only `v1alpha`); the types a refused call's status details carry
(the `google.rpc` error model, which no service's file imports, so that
grpcurl and the like decode an error's `ErrorInfo`); method names as symbols (`describe
ors.v1.EnvironmentService.CallTool`: the protobuf pool does not index
methods, see grpc/grpc#34743); and the contract's comments (the descriptors
compiled into the generated modules carry no source info, so our files are
served from the descriptor set that scripts/generate.py writes with it).

Both versions have the same messages on the wire (v1 renamed v1alpha's
package), so one servicer reads and answers both with v1alpha's classes.
"""

from __future__ import annotations

from importlib import resources
from typing import AsyncIterator, Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2

from ors_grpc.protocol.errors import STATUS_MESSAGE_TYPES

__all__ = ["REFLECTION_SERVICE_NAMES", "add_reflection"]

_V1ALPHA = "grpc.reflection.v1alpha"
_V1 = "grpc.reflection.v1"
REFLECTION_SERVICE_NAMES = (f"{_V1}.ServerReflection", f"{_V1ALPHA}.ServerReflection")
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _documented_files() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """proto/'s files with their comments, as scripts/generate.py wrote them."""
    data = resources.files("ors_grpc._generated").joinpath("documented_descriptors.binpb").read_bytes()
    return {file.name: file for file in descriptor_pb2.FileDescriptorSet.FromString(data).file}


def _v1_reflection_file() -> descriptor_pb2.FileDescriptorProto:
    """The v1 reflection file: v1alpha's, under v1's package and name."""
    file = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(file)
    file.name, file.package = _V1_FILE, _V1
    for message in file.message_type:
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(f".{_V1ALPHA}.", f".{_V1}.")
    for service in file.service:
        for method in service.method:
            method.input_type = method.input_type.replace(f".{_V1ALPHA}.", f".{_V1}.")
            method.output_type = method.output_type.replace(f".{_V1ALPHA}.", f".{_V1}.")
    return file


class _Files:
    """The files that define the served services, the status details' types
    and their dependencies, and a pool of them to find which file holds a symbol."""

    def __init__(self, service_names: Iterable[str]) -> None:
        documented = _documented_files()
        self.protos: dict[str, descriptor_pb2.FileDescriptorProto] = {_V1_FILE: _v1_reflection_file()}
        default = descriptor_pool.Default()
        for name in service_names:
            if not name.startswith(_V1 + "."):
                self._collect(default.FindServiceByName(name).file, documented)
        for message_type in STATUS_MESSAGE_TYPES:
            self._collect(message_type.DESCRIPTOR.file, documented)
        self.pool = descriptor_pool.DescriptorPool()
        added: set[str] = set()
        for name in self.protos:
            self._add(name, added)

    def _collect(self, file: descriptor_pool.descriptor.FileDescriptor, documented: dict) -> None:
        if file.name in self.protos:
            return
        proto = documented.get(file.name)
        if proto is None:
            proto = descriptor_pb2.FileDescriptorProto()
            file.CopyToProto(proto)
        self.protos[file.name] = proto
        for dependency in file.dependencies:
            self._collect(dependency, documented)

    def _add(self, name: str, added: set[str]) -> None:
        if name in added:
            return
        for dependency in self.protos[name].dependency:
            self._add(dependency, added)
        self.pool.AddSerializedFile(self.protos[name].SerializeToString())
        added.add(name)

    def with_dependencies(self, name: str) -> list[bytes]:
        """File `name` and every file it imports, serialized (KeyError if unknown)."""
        ordered: list[str] = []

        def visit(file_name: str) -> None:
            if file_name not in ordered:
                ordered.append(file_name)
                for dependency in self.protos[file_name].dependency:
                    visit(dependency)

        visit(name)
        return [self.protos[file_name].SerializeToString() for file_name in ordered]

    def file_of_symbol(self, symbol: str) -> str:
        """The file that declares a service, method, message, enum or field (KeyError if none)."""
        try:
            return self.pool.FindFileContainingSymbol(symbol).name
        except KeyError:
            service_name, _, method = symbol.rpartition(".")
            service = self.pool.FindServiceByName(service_name)  # KeyError: no such symbol
            if method not in service.methods_by_name:
                raise
            return service.file.name


class _ReflectionServicer:
    def __init__(self, service_names: Iterable[str]) -> None:
        self._service_names = sorted({*service_names, *REFLECTION_SERVICE_NAMES})
        self._files = _Files(self._service_names)

    async def info(
        self, requests: AsyncIterator[reflection_pb2.ServerReflectionRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[reflection_pb2.ServerReflectionResponse]:
        async for request in requests:
            yield self._answer(request)

    def _answer(self, request: reflection_pb2.ServerReflectionRequest) -> reflection_pb2.ServerReflectionResponse:
        kind = request.WhichOneof("message_request")
        try:
            if kind == "list_services":
                services = [reflection_pb2.ServiceResponse(name=name) for name in self._service_names]
                return reflection_pb2.ServerReflectionResponse(
                    original_request=request, list_services_response=reflection_pb2.ListServiceResponse(service=services)
                )
            if kind == "file_by_filename":
                return self._files_answer(request, request.file_by_filename)
            if kind == "file_containing_symbol":
                return self._files_answer(request, self._files.file_of_symbol(request.file_containing_symbol))
            if kind == "all_extension_numbers_of_type":
                message = self._files.pool.FindMessageTypeByName(request.all_extension_numbers_of_type)
                numbers = sorted(ext.number for ext in self._files.pool.FindAllExtensions(message))
                return reflection_pb2.ServerReflectionResponse(
                    original_request=request, all_extension_numbers_response=reflection_pb2.ExtensionNumberResponse(
                        base_type_name=message.full_name, extension_number=numbers
                    ),
                )
            if kind == "file_containing_extension":
                wanted = request.file_containing_extension
                message = self._files.pool.FindMessageTypeByName(wanted.containing_type)
                extension = self._files.pool.FindExtensionByNumber(message, wanted.extension_number)
                return self._files_answer(request, extension.file.name)
        except KeyError:
            return _error(request, grpc.StatusCode.NOT_FOUND, "not found")
        return _error(request, grpc.StatusCode.INVALID_ARGUMENT, "no request")

    def _files_answer(
        self, request: reflection_pb2.ServerReflectionRequest, file_name: str
    ) -> reflection_pb2.ServerReflectionResponse:
        return reflection_pb2.ServerReflectionResponse(
            original_request=request,
            file_descriptor_response=reflection_pb2.FileDescriptorResponse(
                file_descriptor_proto=self._files.with_dependencies(file_name)
            ),
        )


def _error(
    request: reflection_pb2.ServerReflectionRequest, code: grpc.StatusCode, message: str
) -> reflection_pb2.ServerReflectionResponse:
    return reflection_pb2.ServerReflectionResponse(
        original_request=request,
        error_response=reflection_pb2.ErrorResponse(error_code=code.value[0], error_message=message),
    )


def add_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection (v1 and v1alpha) of `service_names` (and itself) on `server`."""
    servicer = _ReflectionServicer(service_names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.info,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(tuple(
        grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": handler})
        for name in REFLECTION_SERVICE_NAMES
    ))
