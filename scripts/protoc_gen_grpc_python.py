"""A protoc plugin emitting gRPC Python stubs, for `buf generate`.

grpcio-tools compiles its gRPC generator into its bundled protoc instead of
shipping a `protoc-gen-grpc_python` binary, so buf cannot call it directly.
This plugin hands buf's request to that bundled protoc and returns its output.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from grpc_tools import protoc


def generate(request: plugin_pb2.CodeGeneratorRequest) -> plugin_pb2.CodeGeneratorResponse:
    response = plugin_pb2.CodeGeneratorResponse(
        supported_features=plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    )
    with tempfile.TemporaryDirectory() as tmp:
        descriptors = Path(tmp) / "descriptors.pb"
        descriptors.write_bytes(descriptor_pb2.FileDescriptorSet(file=request.proto_file).SerializeToString())
        out = Path(tmp) / "out"
        out.mkdir()
        args = ["protoc", f"--descriptor_set_in={descriptors}", f"--grpc_python_out={out}"]
        if protoc.main([*args, *request.file_to_generate]) != 0:
            response.error = "grpc_tools.protoc failed"
            return response
        for path in sorted(out.rglob("*.py")):
            response.file.add(name=str(path.relative_to(out)), content=path.read_text())
    return response


if __name__ == "__main__":
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    sys.stdout.buffer.write(generate(request).SerializeToString())
