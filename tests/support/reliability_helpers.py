"""Helpers of the reliability tests: a `serve` subprocess of the probe environments
and short ways to drive both doors (raw HTTP with aiohttp, gRPC with stubs)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, NamedTuple, Sequence

import aiohttp
import grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from tests.support.bridge_http import read_sse
from tests.support.reliability_environments import MARKER_DIR_VARIABLE
from tests.support.servers import ServeProcess, run_cli_logging_to, start_serve

PROBE_ENVIRONMENTS = (
    "tests.support.reliability_environments:ProbeEnv",
    "tests.support.reliability_environments:LateFailingSetupEnv",
    "tests.support.reliability_environments:LeakySetupEnv",
    "tests.support.reliability_environments:LeakyPromptEnv",
)
#: Upper bound of every wait for something the server does on its own.
WAIT_S = 20.0


@contextlib.contextmanager
def serve_probe(*options: str, marker_dir: Path | None = None) -> Iterator[ServeProcess]:
    """`ors-grpc serve` of the probe environments with both doors; teardown
    markers go to `marker_dir`."""
    env = {MARKER_DIR_VARIABLE: str(marker_dir)} if marker_dir else None
    with start_serve(*PROBE_ENVIRONMENTS, "--http-port", "0", *options, env=env) as serve:
        yield serve


@contextlib.asynccontextmanager
async def grpc_stub(target: str) -> AsyncIterator[pb_grpc.EnvironmentServiceStub]:
    async with grpc.aio.insecure_channel(target) as channel:
        yield pb_grpc.EnvironmentServiceStub(channel)


async def open_sessions(stub: pb_grpc.EnvironmentServiceStub) -> int:
    return (await stub.Health(pb.HealthRequest())).open_sessions


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll `check` until it holds; fail with `what` after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


class Door(NamedTuple):
    """One HTTP door, the log of the process behind it and its process id."""

    name: str
    http_url: str
    log: Path
    pid: int


class Doors(NamedTuple):
    grpc_target: str
    http: list[Door]


@contextlib.contextmanager
def both_doors(folder: Path, environments: Sequence[str], *options: str,
               bridge_options: tuple[str, ...] = ()) -> Iterator[Doors]:
    """`ors-grpc serve` of `environments` with `--http-port`, and `ors-grpc
    bridge` onto its gRPC port, both logging at DEBUG into `folder`;
    `options` go to the server and its `--http...` ones to the bridge too
    (HTTP limits), `bridge_options` to the bridge only."""
    with run_cli_logging_to(folder / "serve.log", "serve", *environments, "--port", "0", "--http-port", "0",
                            *options) as serve_doors:
        http_options = [option for option in options if option.startswith("--http")]
        values = [value for option, value in zip(options, options[1:]) if option.startswith("--http")]
        bridge_arguments = [item for pair in zip(http_options, values) for item in pair]
        with run_cli_logging_to(folder / "bridge.log", "bridge", "--backend", serve_doors["gRPC"], "--http-port", "0",
                                *bridge_arguments, *bridge_options) as bridge_doors:
            yield Doors(serve_doors["gRPC"], [
                Door("serve --http-port", f"http://{serve_doors['HTTP']}", folder / "serve.log",
                     int(serve_doors["pid"])),
                Door("ors-grpc bridge", f"http://{bridge_doors['HTTP']}", folder / "bridge.log",
                     int(bridge_doors["pid"])),
            ])


# HTTP -------------------------------------------------------------------------


async def http_episode(http: aiohttp.ClientSession, tag: str, env_name: str = "probeenv", **headers: str) -> str:
    """A new session with an episode on the task `{"tag": tag}`; its id."""
    async with http.post("/create_session") as response:
        sid = (await response.json())["sid"]
    body = {"env_name": env_name, "task_spec": {"tag": tag, "answer": "yes"}}
    async with http.post("/create", json=body, headers={"X-Session-ID": sid, **headers}) as response:
        assert response.status == 200, await response.text()
    return sid


async def http_call(http: aiohttp.ClientSession, sid: str, name: str, tool_input: dict | None = None, **extra: Any) -> Any:
    """Run a tool over HTTP; the SSE stream's events."""
    body = {"name": name, "input": tool_input or {}, **extra}
    async with http.post("/probeenv/call", json=body, headers={"X-Session-ID": sid}) as response:
        assert response.status == 200, await response.text()
        return await read_sse(response)


async def http_stats(http: aiohttp.ClientSession, sid: str) -> dict:
    """The session's run counters (the `stats` tool)."""
    return (await http_call(http, sid, "stats")).result()["output"]["metadata"]


async def http_start_call_and_drop(http: aiohttp.ClientSession, sid: str, name: str, tool_input: dict) -> str:
    """Start a call, read its task id, then drop the stream; the task id."""
    body = {"name": name, "input": tool_input}
    async with http.post("/probeenv/call", json=body, headers={"X-Session-ID": sid}) as response:
        assert await response.content.readline() == b"event: task_id\n"
        task_id = (await response.content.readline()).decode().removeprefix("data: ").strip()
        response.close()
    return task_id


# gRPC -------------------------------------------------------------------------


async def grpc_episode(
    stub: pb_grpc.EnvironmentServiceStub, tag: str, env_name: str = "probeenv", secrets: dict | None = None
) -> str:
    sid = (await stub.CreateSessionId(pb.CreateSessionIdRequest())).session_id
    request = pb.CreateEpisodeRequest(session_id=sid, env_name=env_name, secrets=secrets or {})
    request.task_spec.json = json.dumps({"tag": tag, "answer": "yes"})
    await stub.CreateEpisode(request, metadata=(("x-session-id", sid),))
    return sid


def grpc_call_request(sid: str, name: str, tool_input: dict | None = None, task_id: str = "") -> pb.CallToolRequest:
    request = pb.CallToolRequest(session_id=sid)
    request.call.name, request.call.task_id = name, task_id
    request.call.input.json = json.dumps(tool_input or {})
    return request


async def grpc_call(stub: pb_grpc.EnvironmentServiceStub, sid: str, name: str, tool_input: dict | None = None,
                    task_id: str = "") -> list[pb.CallToolResponse]:
    """Run (or attach to) a call over gRPC; every event of its stream."""
    request = grpc_call_request(sid, name, tool_input, task_id)
    return [event async for event in stub.CallTool(request, metadata=(("x-session-id", sid),))]


async def grpc_pid(stub: pb_grpc.EnvironmentServiceStub, sid: str, tool: str = "pid") -> int:
    """The pid a worker probe tool reports (tests/support/worker_environments): `pid`, the episode's
    process, or `importer_pid`, the process that imported its module."""
    events = await grpc_call(stub, sid, tool)
    return json.loads(events[-1].result.output.metadata.json)["pid"]


async def grpc_stats(stub: pb_grpc.EnvironmentServiceStub, sid: str) -> dict:
    events = await grpc_call(stub, sid, "stats")
    return json.loads(events[-1].result.output.metadata.json)
