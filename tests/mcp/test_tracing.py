"""Tracing through the MCP door: a `tools/call` carrying a `traceparent` in
its `_meta` is one trace with its RPC and its tool; with tracing off the
door adds no middleware of its own but the handshake's."""

from __future__ import annotations

import asyncio

import aiohttp

from mcp_bridge._server import build_server as build_mcp_server
from ors_grpc.observability import tracing
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.server import create_server, in_process_channel
from tests.support.console_spans import assert_one_call_trace, console_spans, drain
from tests.support.environments import EchoEnv
from tests.support.servers import start_serve


async def test_tracing_off_the_mcp_door_adds_only_its_own_middleware() -> None:
    assert tracing.tracer is None and not tracing.enabled()
    server, _ = await create_server([EchoEnv], "127.0.0.1:0")
    try:
        mcp_middleware = build_mcp_server(pb_grpc.EnvironmentServiceStub(in_process_channel(server))).middleware
        assert [handler.__name__ for handler in mcp_middleware] == ["initialize"]  # the door's own only
    finally:
        await server.stop(None)


def test_otel_environment_traces_an_mcp_call_into_its_rpc_and_tool() -> None:
    otel = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4737"
    with start_serve("tests.support.environments:EchoEnv", "--mcp-port", "0", env=otel) as serve:
        asyncio.run(_one_mcp_call(f"{serve.mcp_url}/echoenv/mcp?split=train&index=0",
                                  f"00-{trace_id}-00f067aa0ba902b8-01"))
        serve.stop()
        spans = console_spans(drain(serve))
    mcp_span = next(span for span in spans if span["name"] == "tools/call echo")
    assert_one_call_trace(mcp_span, spans, trace_id, "00f067aa0ba902b8")


async def _one_mcp_call(url: str, traceparent: str) -> None:
    """One MCP session on the convenience URL with one `tools/call` carrying `traceparent` in its `_meta`."""
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"text": "x"}, "_meta": {"traceparent": traceparent}}}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=initialize, headers=accept) as response:
            assert response.status == 200
            session = {"mcp-session-id": response.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        async with http.post(url, json=call, headers={**accept, **session}) as response:
            assert response.status == 200 and '"isError":false' in (await response.text()).replace(" ", "")
        async with http.delete(url, headers=session) as response:
            assert response.status < 300
