"""proto/ is ready for other languages' generators with no flags, and the offline templates of
templates/ (docs/clients.md) work: a Go client generated with templates/buf.gen.go.yaml runs an
episode against `ors-grpc serve`; protoc's Java output compiles; Ruby, C#, PHP and Objective-C
land in the namespaces the language options name.

The generators are system packages (Debian: protobuf-compiler, protobuf-compiler-grpc,
libprotobuf-java, golang-go, protoc-gen-go, protoc-gen-go-grpc and the Go libraries; .ci/run
installs them); without one a test is skipped, saying which.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2, errors_pb2, types_pb2
from tests.support.servers import ROOT, start_serve
from tests.support.tooling import NPM_CI_TIMEOUT_S, ensure_node_packages

PROTOS = sorted(str(path.relative_to(ROOT / "proto")) for path in (ROOT / "proto").rglob("*.proto"))
GO_PACKAGE = "openrewardstandard.io/ors/gen/go/ors/v1"
#: Debian's Go libraries (golang-google-grpc-dev, ...), for a GOPATH build without a module proxy.
DEBIAN_GOCODE = Path("/usr/share/gocode")
DEBIAN_PROTOBUF_JAR = Path("/usr/share/java/protobuf.jar")

pytestmark = pytest.mark.timeout(NPM_CI_TIMEOUT_S + 300)


def require(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (see this file's docstring for the packages)")


def require_path(path: Path, package: str) -> None:
    if not path.exists():
        pytest.skip(f"{path} is missing (Debian package {package})")


def run(command: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{command}:\n{result.stdout}{result.stderr}"
    return result.stdout


def buf_generate(template: str, out: Path) -> Path:
    """`buf generate --template templates/<template>` from the repository root, as docs/clients.md says."""
    ensure_node_packages(ROOT)  # buf, pinned in package.json
    run([str(ROOT / "node_modules" / ".bin" / "buf"), "generate", "--template", f"templates/{template}",
         "--output", str(out)])
    return out


def protoc(out: Path, *outputs: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    run(["protoc", f"--proto_path={ROOT / 'proto'}", *(f"--{kind}_out={out}" for kind in outputs), *PROTOS])
    return out


@pytest.mark.parametrize(
    ("module", "outer_class"),
    [(types_pb2, "TypesProto"), (errors_pb2, "ErrorsProto"), (environment_service_pb2, "EnvironmentServiceProto")],
)
def test_every_file_names_its_package_for_the_common_generators(module, outer_class: str) -> None:
    options = module.DESCRIPTOR.GetOptions()
    assert options.go_package == f"{GO_PACKAGE};orsv1"
    assert (options.java_package, options.java_multiple_files) == ("io.openrewardstandard.ors.v1", True)
    assert options.java_outer_classname == outer_class
    assert options.csharp_namespace == "OpenRewardStandard.Ors.V1"
    assert options.ruby_package == "OpenRewardStandard::Ors::V1"
    assert options.php_namespace == "OpenRewardStandard\\Ors\\V1"
    assert options.objc_class_prefix == "ORS"


def test_a_go_client_generated_by_the_template_runs_an_episode(tmp_path: Path) -> None:
    require("go", "protoc-gen-go", "protoc-gen-go-grpc")
    require_path(DEBIAN_GOCODE / "src" / "google.golang.org" / "grpc", "golang-google-grpc-dev")
    generated = buf_generate("buf.gen.go.yaml", tmp_path / "out") / "gen" / "go" / "ors" / "v1"
    assert sorted(p.name for p in generated.iterdir()) == [
        "environment_service.pb.go", "environment_service_grpc.pb.go", "errors.pb.go", "types.pb.go"
    ]
    gopath = tmp_path / "gopath"
    shutil.copytree(generated, gopath / "src" / GO_PACKAGE)  # where go_package says it lives
    shutil.copytree(ROOT / "tests" / "client" / "go_client", gopath / "src" / "orsclient")
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": f"{gopath}{os.pathsep}{DEBIAN_GOCODE}", "GOFLAGS": ""}
    binary = tmp_path / "orsclient"
    run(["go", "build", "-o", str(binary), "."], cwd=gopath / "src" / "orsclient", env=env)
    with start_serve() as serve:  # the embedded `arithmetic` example
        printed = run([str(binary), serve.grpc_target])
    assert printed.splitlines() == ["What is 12 + 30? Use the calculator, then submit the answer.", "Correct! 1 true"]


def test_protoc_java_output_is_one_class_per_message_in_the_java_package_and_compiles(tmp_path: Path) -> None:
    require("protoc", "javac")
    require_path(DEBIAN_PROTOBUF_JAR, "libprotobuf-java")
    package_dir = protoc(tmp_path / "java", "java") / "io" / "openrewardstandard" / "ors" / "v1"
    names = {path.name for path in package_dir.iterdir()}
    assert {"TextBlock.java", "CallToolResponse.java", "ErrorReason.java", "TypesProto.java",
            "EnvironmentServiceProto.java"} <= names
    assert "package io.openrewardstandard.ors.v1;" in (package_dir / "TextBlock.java").read_text()
    classes = tmp_path / "classes"
    sources = [str(path) for path in package_dir.glob("*.java")]
    run(["javac", "-nowarn", "-d", str(classes), "-cp", str(DEBIAN_PROTOBUF_JAR), *sources])
    assert (classes / "io" / "openrewardstandard" / "ors" / "v1" / "TextBlock.class").exists()


def test_the_ruby_template_writes_messages_and_stubs_in_the_ruby_package(tmp_path: Path) -> None:
    require("protoc", "grpc_ruby_plugin")
    generated = buf_generate("buf.gen.ruby.yaml", tmp_path / "out") / "gen" / "ruby" / "ors" / "v1"
    assert sorted(p.name for p in generated.iterdir()) == [
        "environment_service_pb.rb", "environment_service_services_pb.rb", "errors_pb.rb", "types_pb.rb"
    ]
    stubs = (generated / "environment_service_services_pb.rb").read_text()
    assert "rpc :CallTool, ::OpenRewardStandard::Ors::V1::CallToolRequest, stream(" in stubs


def test_csharp_php_and_objc_land_in_their_namespaces(tmp_path: Path) -> None:
    require("protoc")
    out = protoc(tmp_path, "csharp", "php", "objc")
    assert "namespace OpenRewardStandard.Ors.V1 {" in (out / "Types.cs").read_text()
    php = out / "OpenRewardStandard" / "Ors" / "V1" / "TextBlock.php"
    assert "namespace OpenRewardStandard\\Ors\\V1;" in php.read_text()
    assert "@interface ORSTextBlock : GPBMessage" in (out / "ors" / "v1" / "Types.pbobjc.h").read_text()
