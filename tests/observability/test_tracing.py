"""OpenTelemetry tracing: one `/call` is one trace across the bridge and the service, through
either door (the MCP door's in tests/mcp/test_tracing.py); a gRPC client's `traceparent` continues
too; no secrets or tool input in spans; nothing installed while tracing is off; the OTEL_*
environment turns it on in the CLI."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator

import aiohttp
import grpc
import pytest
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from http_bridge import create_app, start_bridge
from http_bridge._tracing import trace_requests
from ors_grpc.extras import extra_install_command
from ors_grpc.observability import tracing
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.server import create_server, in_process_channel
from tests.support.bridge_http import parse_sse
from tests.support.console_spans import CALL_TOOL, assert_one_call_trace, console_spans, drain
from tests.support.grpc_calls import tool_call
from tests.support.environments import EchoEnv
from tests.support.otlp_collector import SPAN_WAIT_S, otlp_collector
from tests.support.servers import ROOT, start_serve
from tests.support.servers import start_bridge as start_bridge_process

SECRET = "s3cr3t-value-never-in-spans"
TOOL_INPUT = "tool-input-never-in-spans"


@dataclass
class Recording:
    """Tracing on, into memory."""

    provider: TracerProvider
    exporter: InMemorySpanExporter


@pytest.fixture
def recording() -> Iterator[Recording]:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    yield Recording(provider, exporter)
    tracing.disable()


def remote_parent(recording: Recording) -> tuple[Any, dict[str, str]]:
    """A client's span (ended at once: only its id travels) and the headers that carry it."""
    with recording.provider.get_tracer("test-client").start_as_current_span("agent step") as span:
        headers: dict[str, str] = {}
        inject(headers)
    return span.get_span_context(), headers


async def finished_spans(recording: Recording, *names: str) -> list[ReadableSpan]:
    """The finished spans, once every one of `names` is among them."""
    deadline = time.monotonic() + SPAN_WAIT_S
    while True:
        spans = list(recording.exporter.get_finished_spans())
        if set(names) <= {span.name for span in spans} or time.monotonic() > deadline:
            return spans
        await asyncio.sleep(0.02)


def named(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    matching = [span for span in spans if span.name == name]
    assert len(matching) == 1, f"{name}: {[span.name for span in spans]}"
    return matching[0]


def assert_nothing_secret(spans: list[ReadableSpan]) -> None:
    for span in spans:
        values = [str(value) for value in (span.attributes or {}).values()]
        values += [str(span.status.description or ""), span.name]
        values += [str(value) for event in span.events for value in (event.attributes or {}).values()]
        assert not [value for value in values if SECRET in value or TOOL_INPUT in value], span.name


@contextlib.asynccontextmanager
async def bridge(door: str) -> AsyncIterator[aiohttp.ClientSession]:
    """The bridge in front of a server in this process: `embedded` (the in-process channel, as
    `serve --http-port`) or `standalone` (a gRPC channel over loopback, as `ors-grpc bridge`)."""
    server, port = await create_server([EchoEnv], "127.0.0.1:0")
    channel = in_process_channel(server) if door == "embedded" else None
    runner, http_port = await start_bridge(f"127.0.0.1:{port}", "127.0.0.1", 0, channel=channel)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{http_port}") as http:
            yield http
    finally:
        await runner.cleanup()
        await server.stop(None)


@pytest.mark.parametrize("door", ["embedded", "standalone"])
async def test_one_call_is_one_trace_across_both_hops(recording: Recording, door: str) -> None:
    async with bridge(door) as http:
        async with http.post("/create_session") as response:
            sid = (await response.json())["sid"]
        secrets_header = base64.b64encode(json.dumps({"KEY": {"value": SECRET}}).encode()).decode()
        create_parent, headers = remote_parent(recording)
        async with http.post("/create", json={"split": "train", "index": 0, "secrets": {"OTHER": SECRET}},
                             headers={**headers, "X-Session-ID": sid, "X-Secrets": secrets_header}) as response:
            assert response.status == 200
        call_parent, headers = remote_parent(recording)
        async with http.post("/echoenv/call", json={"name": "echo", "input": {"text": TOOL_INPUT}},
                             headers={**headers, "X-Session-ID": sid}) as response:
            assert response.status == 200
            assert parse_sse(await response.text()).result()["ok"] is True
        spans = await finished_spans(recording, "POST /{env}/call", CALL_TOOL, "execute_tool echo", "ors.setup")

    # /call: client -> HTTP span -> CallTool RPC span -> tool span, one trace.
    http_span = named(spans, "POST /{env}/call")
    rpc_span = named(spans, CALL_TOOL)
    tool_span = named(spans, "execute_tool echo")
    assert {span.context.trace_id for span in (http_span, rpc_span, tool_span)} == {call_parent.trace_id}
    assert http_span.parent.span_id == call_parent.span_id
    assert rpc_span.parent.span_id == http_span.context.span_id
    assert tool_span.parent.span_id == rpc_span.context.span_id
    assert http_span.attributes["http.route"] == "/{env}/call"
    assert http_span.attributes["http.response.status_code"] == 200
    assert rpc_span.attributes["rpc.method"] == "CallTool"
    # (Its status code may be OK or CANCELLED: the bridge cancels the stream once it has the result.)
    assert rpc_span.attributes["ors.session_id"] == sid
    assert dict(tool_span.attributes) == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "echo", "ors.environment": "echoenv",
        "ors.session_id": sid, "ors.outcome": "ok",
    }

    # /create: HTTP span -> CreateEpisode RPC span -> setup span (which outlives the RPC).
    create_span = named(spans, "POST /create")
    create_rpc = named(spans, "ors.v1.EnvironmentService/CreateEpisode")
    setup_span = named(spans, "ors.setup")
    assert create_span.context.trace_id == create_parent.trace_id
    assert create_rpc.parent.span_id == create_span.context.span_id
    assert setup_span.parent.span_id == create_rpc.context.span_id
    assert create_rpc.attributes["rpc.grpc.status_code"] == 0
    assert setup_span.attributes["ors.outcome"] == "ok"
    assert setup_span.attributes["ors.session_id"] == sid

    assert_nothing_secret(spans)


async def test_a_grpc_clients_traceparent_continues(recording: Recording) -> None:
    server, port = await create_server([EchoEnv], "127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            sid = (await stub.CreateSessionId(pb.CreateSessionIdRequest())).session_id
            await stub.CreateEpisode(pb.CreateEpisodeRequest(session_id=sid, task_spec={"json": "{}"}))
            parent, headers = remote_parent(recording)
            call = pb.CallToolRequest(session_id=sid, call=tool_call("fail"))
            async for _ in stub.CallTool(call, metadata=tuple(headers.items())):
                pass
        spans = await finished_spans(recording, CALL_TOOL, "execute_tool fail")
    finally:
        await server.stop(None)
    rpc_span = named(spans, CALL_TOOL)
    tool_span = named(spans, "execute_tool fail")
    assert rpc_span.context.trace_id == parent.trace_id and rpc_span.parent.span_id == parent.span_id
    assert tool_span.parent.span_id == rpc_span.context.span_id
    assert tool_span.attributes["ors.outcome"] == "failed"
    assert tool_span.status.status_code.name == "ERROR"


async def test_tracing_off_installs_nothing() -> None:
    assert tracing.tracer is None and not tracing.enabled()
    server, port = await create_server([EchoEnv], "127.0.0.1:0")
    try:
        channel = in_process_channel(server)
        assert not any(isinstance(i, tracing.RpcTracingInterceptor) for i in channel._interceptors)
        assert trace_requests not in create_app(f"127.0.0.1:{port}", channel=channel).middlewares
        assert tracing.propagating(channel) is channel
    finally:
        await server.stop(None)


# ----------------------------------------------------------------------------
# The CLI, configured by the standard environment, across processes
# ----------------------------------------------------------------------------


def test_otel_environment_traces_serve_and_bridge_processes() -> None:
    otel = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    with start_serve("tests.support.environments:EchoEnv", env={**otel, "OTEL_SERVICE_NAME": "ors-backend"}) as serve:
        with start_bridge_process(serve.grpc_target, env={**otel, "OTEL_SERVICE_NAME": "ors-bridge"}) as bridge:
            trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
            headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
            asyncio.run(_one_episode(bridge.http_url, headers))
            bridge.stop()
            bridge_spans = console_spans(drain(bridge))
        serve.stop()
        backend_spans = console_spans(drain(serve))
    http_span = next(span for span in bridge_spans if span["name"] == "POST /{env}/call")
    rpc_span = assert_one_call_trace(http_span, backend_spans, trace_id, "00f067aa0ba902b7")
    assert http_span["resource"]["attributes"]["service.name"] == "ors-bridge"
    assert rpc_span["resource"]["attributes"]["service.name"] == "ors-backend"


async def _one_episode(url: str, headers: dict[str, str]) -> None:
    async with aiohttp.ClientSession(base_url=url) as http:
        async with http.post("/create_session") as response:
            sid = (await response.json())["sid"]
        async with http.post("/create", json={"split": "train", "index": 0}, headers={"X-Session-ID": sid}):
            pass
        async with http.post("/echoenv/call", json={"name": "echo", "input": {"text": "x"}},
                             headers={**headers, "X-Session-ID": sid}) as response:
            assert parse_sse(await response.text()).result()["ok"] is True


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_an_otlp_endpoint_alone_turns_tracing_on(protocol: str) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT without OTEL_TRACES_EXPORTER exports with otlp (the distro's
    convention), over the protocol OTEL_EXPORTER_OTLP_PROTOCOL names (grpc by default)."""
    with otlp_collector(protocol) as (collector, endpoint):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        if protocol != "grpc":
            env["OTEL_EXPORTER_OTLP_PROTOCOL"] = protocol
        with start_serve("tests.support.environments:EchoEnv", "--http-port", "0", env=env) as serve:
            trace_id = "0af7651916cd43dd8448eb211c80319c"
            asyncio.run(_one_episode(serve.http_url, {"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}))
            spans = collector.wait_for("POST /{env}/call", CALL_TOOL, "execute_tool echo")
    http_span, rpc_span, tool_span = spans["POST /{env}/call"], spans[CALL_TOOL], spans["execute_tool echo"]
    assert http_span.trace_id.hex() == rpc_span.trace_id.hex() == tool_span.trace_id.hex() == trace_id
    assert http_span.parent_span_id.hex() == "b7ad6b7169203331"
    assert rpc_span.parent_span_id == http_span.span_id
    assert tool_span.parent_span_id == rpc_span.span_id


@pytest.mark.parametrize(("env", "on", "says"), [
    ({}, False, ""),
    ({"OTEL_TRACES_EXPORTER": "none"}, False, ""),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, False, ""),
    ({"OTEL_TRACES_EXPORTER": "console"}, True, "tracing_enabled exporters=console"),
    ({"OTEL_TRACES_EXPORTER": "nosuch"}, False, "tracing_disabled reason=no OpenTelemetry trace exporter named 'nosuch'"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, False,
     "tracing_disabled reason=unsupported OTLP protocol 'http/json'"),
])
def test_the_environment_decides_and_a_mistake_is_one_line(env: dict[str, str], on: bool, says: str) -> None:
    """Checked in a fresh process: the choice is made once, and installs a global provider."""
    program = ("import logging; logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
               "from ors_grpc.observability import tracing; print('on' if tracing.enabled() else 'off')")
    clean = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    result = subprocess.run([sys.executable, "-c", program], env={**clean, **env}, capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.stdout.strip() == ("on" if on else "off")
    assert result.stderr.strip() == says or (says and result.stderr.strip().startswith(says)), result.stderr


@pytest.mark.parametrize(("env", "says"), [
    ({}, ""),
    # The hint names the command that adds the extra to this installation (no index has ors-grpc).
    ({"OTEL_TRACES_EXPORTER": "console"}, "tracing_disabled reason=OTEL_* asks for traces but OpenTelemetry is not"
                                          f" installed: {extra_install_command('otel')}"),
])
def test_without_opentelemetry_installed_a_server_and_its_bridge_serve_untraced(env: dict[str, str], says: str) -> None:
    program = """
import asyncio, logging, sys
sys.modules["opentelemetry"] = None  # as if not installed: importing it fails
logging.basicConfig(level=logging.INFO, format="%(message)s")
import aiohttp
from http_bridge import start_bridge
from ors_grpc.server import create_server, in_process_channel
from tests.support.environments import EchoEnv

async def main():
    server, port = await create_server([EchoEnv], "127.0.0.1:0")
    runner, http_port = await start_bridge("", "127.0.0.1", 0, channel=in_process_channel(server))
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{http_port}/echoenv/tools") as response:
            print(response.status)
    await runner.cleanup()
    await server.stop(None)

asyncio.run(main())
"""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    result = subprocess.run([sys.executable, "-c", program], env={**clean, **env, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.stdout.strip() == "200", result.stderr
    logged = [line for line in result.stderr.splitlines() if line.startswith("tracing")]
    assert logged == ([says] if says else []) or (says and len(logged) == 1 and logged[0].startswith(says))


async def test_a_run_episode_streams_tool_calls_are_spans_of_its_session(recording: Recording) -> None:
    server, port = await create_server([EchoEnv], "127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            parent, headers = remote_parent(recording)
            stream = pb_grpc.EnvironmentServiceStub(channel).RunEpisode(metadata=tuple(headers.items()))
            await stream.write(pb.RunEpisodeRequest(create=pb.CreateEpisodeRequest(
                env_name="echoenv", task_spec={"json": "{}"})))
            sid = (await stream.read()).create.session_id
            await stream.write(pb.RunEpisodeRequest(call_tool=pb.ToolCallStep(
                name="echo", input={"json": json.dumps({"text": TOOL_INPUT})}, task_id="t1")))
            assert (await stream.read()).call_tool.HasField("result")
            await stream.done_writing()
            spans = await finished_spans(recording, "ors.v1.EnvironmentService/RunEpisode", "execute_tool echo")
    finally:
        await server.stop(None)
    stream_span = named(spans, "ors.v1.EnvironmentService/RunEpisode")
    tool_span = named(spans, "execute_tool echo")
    assert stream_span.parent.span_id == parent.span_id
    assert tool_span.parent.span_id == stream_span.context.span_id
    assert tool_span.attributes["ors.session_id"] == sid
    assert named(spans, "ors.setup").attributes["ors.session_id"] == sid
    assert_nothing_secret(spans)
