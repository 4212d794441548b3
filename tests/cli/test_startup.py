"""The `ors-grpc` command as a newcomer meets it: every startup mistake is one line on stderr and exit
status 2 with nothing announced, ports are checked on every door, options work where users type them,
`--help` is complete, and startup names every environment and door."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from ors_grpc import __version__
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from tests.support.extras import MCP_EXTRA_INSTALLED
from tests.support.servers import ROOT, run_serve, start_bridge, start_serve

ORS_GRPC = str(Path(sys.executable).parent / "ors-grpc")
LISTENING = re.compile(r"^(gRPC|HTTP|metrics) listening on (\S+):(\d+)$")

pytestmark = pytest.mark.timeout(120)


def run_cli(*args: str, cwd: Path = ROOT, pythonpath: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([ORS_GRPC, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def assert_startup_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit status 2, nothing on stdout (no door announced), one line on stderr holding `fragments`."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert re.match(r"^ors-grpc( serve| bridge)?: error: ", lines[0]), lines[0]
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port another program listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


# Ports -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option", "value"),
    [
        (["serve", "--port", "99999"], "--port", "99999"),
        (["serve", "--port", "-1"], "--port", "-1"),
        (["serve", "--http-port", "84697"], "--http-port", "84697"),
        (["serve", "--metrics-port", "65536"], "--metrics-port", "65536"),
        (["bridge", "--backend", "127.0.0.1:50051", "--http-port", "70000"], "--http-port", "70000"),
        (["bridge", "--backend", "127.0.0.1:50051", "--metrics-port", "-5"], "--metrics-port", "-5"),
        (["bridge", "--backend", "127.0.0.1:99999"], "--backend", "99999"),
    ],
)
def test_a_port_out_of_range_is_refused(args: list[str], option: str, value: str) -> None:
    assert_startup_error(run_cli(*args), option, value, "out of range 0-65535")


def test_a_port_that_is_not_a_number_is_refused() -> None:
    assert_startup_error(run_cli("serve", "--http-port", "eighty"), "--http-port", "not a port number: 'eighty'")


@pytest.mark.parametrize(
    ("door", "args"),
    [
        ("gRPC", ["serve", "--port", "{port}"]),
        ("HTTP", ["serve", "--port", "0", "--http-port", "{port}"]),
        ("metrics", ["serve", "--port", "0", "--http-port", "0", "--metrics-port", "{port}"]),
        ("HTTP", ["bridge", "--backend", "127.0.0.1:50051", "--http-port", "{port}"]),
        ("metrics", ["bridge", "--backend", "127.0.0.1:50051", "--http-port", "0", "--metrics-port", "{port}"]),
    ],
    ids=["serve-grpc", "serve-http", "serve-metrics", "bridge-http", "bridge-metrics"],
)
def test_a_port_in_use_on_any_door_is_an_error_before_any_door_is_announced(
    held_port: int, door: str, args: list[str]
) -> None:
    result = run_cli(*(arg.format(port=held_port) for arg in args))
    assert_startup_error(result, f"{door} door: cannot listen on 127.0.0.1:{held_port}: address already in use")


def test_a_second_server_on_the_same_grpc_port_is_refused_not_sharing_it() -> None:
    with start_serve() as first:
        port = first.grpc_target.rsplit(":", 1)[1]
        assert_startup_error(run_cli("serve", "--port", port), f"gRPC door: cannot listen on 127.0.0.1:{port}")
        assert first.proc.poll() is None


def test_a_host_that_is_not_this_machines_is_one_line() -> None:
    # 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never an address of this host.
    assert_startup_error(run_cli("serve", "--port", "0", "--host", "192.0.2.1"), "gRPC door: cannot listen on 192.0.2.1:0")


@pytest.mark.skipif(MCP_EXTRA_INSTALLED, reason="the mcp extra is installed here; "
                    "tests/environments/test_beside_openreward.py shows this where it is not")
@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["bridge", "--backend", "127.0.0.1:50051"]])
def test_the_mcp_door_without_the_mcp_extra_is_one_line_naming_the_install_command(command: list[str]) -> None:
    # This virtualenv has the project installed editable from ROOT: the command says so, runnable from anywhere.
    assert_startup_error(run_cli(*command, "--mcp-port", "0"),
                         "the MCP door (--mcp-port) needs the mcp extra, which is not installed (missing: the MCP SDK 'mcp'",
                         f"): pip install -e '{ROOT}[mcp]'")


# Environments ----------------------------------------------------------------


def write_module(folder: Path, name: str, source: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(source))


def test_a_class_that_is_not_an_environment_is_one_line() -> None:
    assert_startup_error(run_cli("serve", "json:JSONDecoder"), "json:JSONDecoder is not a subclass of ors_grpc.Environment")


def test_an_environment_of_the_reference_sdk_is_told_which_import_to_change(tmp_path: Path) -> None:
    write_module(tmp_path, "reference_env", """
        from ors import Environment

        class RefEnv(Environment):
            pass
    """)
    result = run_cli("serve", "reference_env:RefEnv", cwd=tmp_path)
    assert_startup_error(result, "reference_env:RefEnv is not a subclass of ors_grpc.Environment",
                         "import Environment from ors_grpc instead of ors")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_here:Env", "cannot import 'no_such_module_here': No module named 'no_such_module_here'"),
        ("ors_grpc.examples.arithmetic:Nope", "module 'ors_grpc.examples.arithmetic' has no attribute 'Nope'"),
        ("just_a_module", "environment must look like module.path:ClassName or path/to/file.py:ClassName, got 'just_a_module'"),
    ],
)
def test_an_environment_that_cannot_be_found_is_one_line(spec: str, message: str) -> None:
    assert_startup_error(run_cli("serve", spec), message)


def test_a_tool_with_a_signature_that_cannot_work_is_one_line_naming_it(tmp_path: Path) -> None:
    write_module(tmp_path, "bad_tool_env", """
        from ors_grpc import Environment, Split, TextBlock, ToolOutput, tool

        class BadToolEnv(Environment):
            @classmethod
            def list_splits(cls):
                return [Split(name="train", type="train")]

            @classmethod
            def list_tasks(cls, split):
                return [{}]

            def get_prompt(self):
                return [TextBlock(text="add")]

            @tool
            def add(self, n: int) -> ToolOutput:
                return ToolOutput(blocks=[TextBlock(text=str(n + 1))])
    """)
    result = run_cli("serve", "bad_tool_env:BadToolEnv", cwd=tmp_path)
    assert_startup_error(result, "tool BadToolEnv.add: its argument `n` is a `int`, not a pydantic BaseModel",
                         "a @tool takes no argument or one pydantic BaseModel")


def test_an_error_in_the_users_own_module_shows_its_traceback(tmp_path: Path) -> None:
    write_module(tmp_path, "broken_env", """
        import json

        SETTINGS = json.loads("{not json")
    """)
    result = run_cli("serve", "broken_env:Env", cwd=tmp_path)
    assert result.returncode != 0 and result.stdout == ""
    assert "Traceback" in result.stderr and "broken_env.py" in result.stderr and "JSONDecodeError" in result.stderr


@pytest.mark.parametrize("missing", ["no_such_dependency_here", "needs"])  # "needs": a prefix of the module's name
def test_a_missing_dependency_of_the_users_module_shows_where_it_is_imported(tmp_path: Path, missing: str) -> None:
    write_module(tmp_path, "needs_dependency", f"import {missing}\n")
    result = run_cli("serve", "needs_dependency:Env", cwd=tmp_path)
    assert result.returncode != 0 and result.stdout == ""
    assert "Traceback" in result.stderr and "needs_dependency.py" in result.stderr
    assert f"No module named '{missing}'" in result.stderr


GUESSGAME = """
    from ors_grpc.examples.arithmetic import Arithmetic

    class GuessGame(Arithmetic):
        pass
"""


@pytest.mark.parametrize(("spec", "mode"), [
    ("./guessgame.py:GuessGame", []), ("guessgame.py:GuessGame", []),
    ("games/guessgame.py:GuessGame", ["--workers", "1"]), ("./guessgame.py:GuessGame", ["--isolation", "episode"]),
])
def test_an_environment_named_by_its_file_serves_in_every_mode(tmp_path: Path, spec: str, mode: list[str]) -> None:
    folder = tmp_path / "games" if spec.startswith("games/") else tmp_path
    folder.mkdir(exist_ok=True)
    write_module(folder, "guessgame", GUESSGAME)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    with run_serve([ORS_GRPC, "serve", spec, "--port", "0", *mode], cwd=tmp_path, env=env) as serve:
        assert next_line(serve, "serving ").startswith("serving guessgame (default): ")
        with grpc.insecure_channel(serve.grpc_target) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            sid = stub.CreateSessionId(pb.CreateSessionIdRequest()).session_id
            stub.CreateEpisode(pb.CreateEpisodeRequest(
                session_id=sid, env_name="guessgame", task_index=pb.TaskIndex(split="train", index=0)))
            prompt = stub.GetPrompt(pb.GetPromptRequest(session_id=sid))  # in a worker: it imported the file too
            assert "What is" in prompt.blocks[0].text.text


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("./no_such_file.py:Env", "no such file: ./no_such_file.py"),
        ("./notes.txt:Env", "./notes.txt is not a Python file (a path must end in .py; a module is module.path)"),
        ("./my-env.py:Env", "./my-env.py: 'my-env' cannot be a module name: rename the file"),
        ("./json.py:Env", "./json.py: the module name 'json' is already taken by "),
        ("./guessgame.py:Nope", "./guessgame.py has no attribute 'Nope'"),
    ],
)
def test_a_file_that_cannot_be_served_is_one_line(tmp_path: Path, spec: str, message: str) -> None:
    for name in ("guessgame", "my-env", "json"):
        write_module(tmp_path, name, GUESSGAME)
    (tmp_path / "notes.txt").write_text("")
    assert_startup_error(run_cli("serve", spec, cwd=tmp_path), message)


@pytest.mark.parametrize(("option", "value"), [("--session-timeout", "0"), ("--max-sessions", "-3"),
                                               ("--tool-timeout", "nan"), ("--max-message-bytes", "lots")])
def test_a_limit_that_is_not_a_positive_number_is_refused(option: str, value: str) -> None:
    assert_startup_error(run_cli("serve", option, value), option, value)


# TLS -------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["bridge", "--backend", "127.0.0.1:50051"]])
def test_a_certificate_without_a_key_is_one_line(command: list[str], tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("unused")
    assert_startup_error(run_cli(*command, "--tls-cert", str(cert)), "TLS needs both --tls-cert and --tls-key")


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["bridge", "--backend", "127.0.0.1:50051"]])
def test_a_missing_tls_file_is_one_line(command: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    result = run_cli(*command, "--tls-cert", str(missing), "--tls-key", str(missing))
    assert_startup_error(result, f"--tls-cert {missing}: No such file or directory")


def test_a_tls_file_that_is_not_pem_is_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    result = run_cli("serve", "--port", "0", "--tls-cert", str(junk), "--tls-key", str(junk))
    assert_startup_error(result, "not a PEM certificate and its key")


def test_a_missing_backend_root_certificate_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "root.pem"
    result = run_cli("bridge", "--backend", "127.0.0.1:50051", "--backend-tls-root-cert", str(missing))
    assert_startup_error(result, f"--backend-tls-root-cert {missing}: No such file or directory")


# Allowed hosts and origins ---------------------------------------------------


@pytest.mark.parametrize("command", [["serve", "--port", "0", "--http-port", "0"],
                                     ["bridge", "--backend", "127.0.0.1:50051", "--http-port", "0"]])
@pytest.mark.parametrize("option, value", [("--allowed-origin", "*"), ("--allowed-origin", "null"),
                                           ("--allowed-host", "*"), ("--allowed-host", "http://x.example")])
def test_a_wildcard_or_malformed_allowed_host_or_origin_is_one_line(command: list[str], option: str, value: str) -> None:
    assert_startup_error(run_cli(*command, option, value), f"{option} {value!r}: expected")


# Options, help, startup lines ------------------------------------------------


def test_version() -> None:
    result = run_cli("--version")
    assert (result.returncode, result.stdout, result.stderr) == (0, f"ors-grpc {__version__}\n", "")


@pytest.mark.parametrize(("command", "groups"), [
    (["serve"], ["options", "environments' code", "doors", "limits", "fleet", "observability"]),
    (["bridge"], ["options", "backend", "doors", "limits", "observability"]),
])
def test_help_is_in_groups_and_says_what_each_limit_does_in_each_mode(command: list[str], groups: list[str]) -> None:
    text = run_cli(*command, "--help").stdout
    assert re.findall(r"^([a-z][a-z' ]*):$", text, flags=re.MULTILINE) == groups
    if command == ["serve"]:
        entries = option_entries(text)
        for option in ("--tool-timeout", "--worker-memory-limit", "--worker-stall-limit"):
            assert "In-process" in entries[option] and "--workers" in entries[option], option
        assert "With --isolation episode" in entries["--tool-timeout"]
        assert "path/to/file.py:ClassName" in text


def test_an_unknown_option_is_one_line_pointing_at_help() -> None:
    assert_startup_error(run_cli("serve", "--prot", "50051"), "unrecognized arguments: --prot", "--help")


def serve_with_stderr(*args: str, stderr_file: Path) -> subprocess.Popen[str]:
    with stderr_file.open("w") as stderr:
        return subprocess.Popen([ORS_GRPC, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)


def grpc_target_of(proc: subprocess.Popen[str]) -> str:
    for line in proc.stdout:
        match = LISTENING.match(line.strip())
        if match and match.group(1) == "gRPC":
            return f"{match.group(2)}:{match.group(3)}"
    raise AssertionError(f"no gRPC listening line; exit status {proc.wait()}")


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_log_level_after_the_subcommand_without_grpcs_own_debug_lines(tmp_path: Path) -> None:
    log = tmp_path / "stderr.txt"
    proc = serve_with_stderr("serve", "--port", "0", "--log-level", "debug", stderr_file=log)
    try:
        with grpc.insecure_channel(grpc_target_of(proc)) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            for _ in range(3):
                assert list(stub.ListEnvironments(pb.ListEnvironmentsRequest()).names) == ["arithmetic"]
    finally:
        assert stop(proc) == 0
    text = log.read_text()
    assert "level=DEBUG logger=ors_grpc.service msg=rpc method=ListEnvironments outcome=OK" in text
    assert "Loaded running loop" not in text and "grpc._cython" not in text


def test_log_level_before_the_subcommand_still_works(tmp_path: Path) -> None:
    log = tmp_path / "stderr.txt"
    proc = serve_with_stderr("--log-level", "WARNING", "serve", "--port", "0", stderr_file=log)
    try:
        grpc_target_of(proc)
    finally:
        assert stop(proc) == 0
    assert "level=INFO" not in log.read_text()  # no server_stopped line


def option_entries(help_text: str) -> dict[str, str]:
    """Each option of an argparse help text ("  --flag METAVAR   help ...") with its help text."""
    entries: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        if re.match(r"^  -", line):
            invocation, _, help_part = line.strip().partition("  ")
            current = invocation.split()[0].rstrip(",")
            entries[current] = help_part.strip()
        elif current and line.startswith("    ") and line.strip():
            entries[current] = (entries[current] + " " + line.strip()).strip()
        else:
            current = None
    return entries


@pytest.mark.parametrize(
    ("command", "defaults"),
    [
        ([], {"--log-level": "INFO"}),
        (["serve"], {"--host": "127.0.0.1", "--port": "50051", "--session-timeout": "900.0",
                     "--max-message-bytes": "33554432", "--log-level": "INFO", "--max-sessions": "no limit",
                     "--tool-timeout": "no limit", "--warm-ttl": "300.0", "--http-body-timeout": "60.0"}),
        (["bridge"], {"--host": "127.0.0.1", "--http-port": "8080", "--max-message-bytes": "33554432",
                      "--http-header-timeout": "30.0",
                      "--log-level": "INFO", "--backend-tls-server-name": "the backend host"}),
    ],
)
def test_help_documents_every_option_with_its_default(command: list[str], defaults: dict[str, str]) -> None:
    result = run_cli(*command, "--help")
    assert result.returncode == 0
    entries = option_entries(result.stdout)
    assert set(defaults) <= set(entries)
    undocumented = [option for option, text in entries.items() if not text]
    assert undocumented == []
    for option, default in defaults.items():
        assert f"(default: {default})" in entries[option], (option, entries[option])


def next_line(serve, prefix: str) -> str:
    while True:
        line = serve.lines.get(timeout=30)
        assert line is not None, "the server exited"
        if line.startswith(prefix):
            return line


def test_startup_names_every_environment_and_door() -> None:
    with start_serve("tests.support.environments:EchoEnv", "ors_grpc.examples.arithmetic:Arithmetic",
                     "--http-port", "0", "--metrics-port", "0") as serve:
        metrics = next_line(serve, "metrics listening on ").split()[-1]
        line = next_line(serve, "serving ")
        assert line == (f"serving echoenv (default), arithmetic: gRPC {serve.grpc_target}, "
                        f"HTTP {serve.http_url}, metrics http://{metrics}/metrics")
        with urllib.request.urlopen(f"{serve.http_url}/list_environments", timeout=30) as response:
            assert response.read() == b'["echoenv","arithmetic"]'
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=30) as response:
            assert response.status == 200


def test_bridge_startup_names_its_backend_and_door() -> None:
    with start_serve() as backend, start_bridge(backend.grpc_target) as bridge:
        line = next_line(bridge, "bridging ")
        assert line == f"bridging onto gRPC backend {backend.grpc_target}: HTTP {bridge.http_url}"

