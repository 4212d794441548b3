"""The floors: bare aiohttp and bare grpc.aio carrying the doors' episode shape, with no application code.

A door's episodes/s means little alone on a shared 2-core machine; as a
share of what its own framework does with the same requests it says how
much the application code above the framework costs. Each floor is a server
process (``python -m bench.floors http|grpc``, on uvloop as ``ors-grpc
serve`` is, printing ``DOOR listening on 127.0.0.1:PORT`` as it does) and a
door of the load generator that runs the same closed loop, with the same
concurrency, as the door it is the floor of:

- ``floor-http`` (the HTTP bridge's): ten POSTs per episode, as the
  bridge's episode makes ten requests, each with a small JSON body that the
  server reads and answers with a 2-event SSE (``task_id``, ``end``).
- ``floor-grpc`` (the gRPC door's through our client): a bidirectional
  stream echoing bytes, eight round trips per episode (create, prompt, five
  calls, delete), streams kept and reused from episode to episode as the
  client's pooled RunEpisode streams are.
- ``floor-grpc-unary`` (``grpc-raw``'s, and a second floor for the gRPC
  door): ten unary echo RPCs per episode, the way stubs in other languages
  run an episode.
"""

import asyncio
import sys
import time
from collections.abc import Callable

import grpc
from aiohttp import web

from bench.http_door import SSE_ACCEPT, PooledHttp, parse_sse

FLOOR_DOORS = ("floor-http", "floor-grpc", "floor-grpc-unary")
#: Door -> its floors, the first the one it is held to.
FLOORS_OF = {
    **dict.fromkeys(("bridge", "bridge-threads", "bridge-on-loop"), ("floor-http",)),
    **dict.fromkeys(("grpc", "grpc-threads", "grpc-on-loop"), ("floor-grpc", "floor-grpc-unary")),
    "grpc-raw": ("floor-grpc-unary",),
}
#: Floor door -> the floor server it runs against (`python -m bench.floors KIND`).
SERVER_OF = {"floor-http": "http", "floor-grpc": "grpc", "floor-grpc-unary": "grpc"}
#: Requests per episode: the bridge's episode makes ten, our client's RunEpisode stream eight steps.
HTTP_REQUESTS, STREAM_STEPS, UNARY_CALLS = 10, 8, 10
#: The tool calls among them (their latency is reported as the doors' tool calls are).
TOOL_CALLS = range(2, 7)
_STREAM = "/floor.Echo/Stream"
_UNARY = "/floor.Echo/Unary"
_SSE_ANSWER = b'event: task_id\ndata: 7f1c9a\n\nevent: end\ndata: {"ok":true,"output":{"finished":false}}\n\n'
_MESSAGE = b'\n\x05step\x12\x08{"n": 1}' + b"\0" * 24  # about a call step's size


def shares(episodes_per_second: dict[str, float]) -> list[tuple[str, str, float]]:
    """(door, floor, the door's episodes/s as a share of the floor's) for every measured door and floor."""
    return [(door, floor, eps / episodes_per_second[floor])
            for door, eps in episodes_per_second.items()
            for floor in FLOORS_OF.get(door, ()) if episodes_per_second.get(floor)]


def print_shares(episodes_per_second: dict[str, float], label: str = "") -> None:
    """One line per door and floor: `door  share of floor (door eps / floor eps)`."""
    for door, floor, share in shares(episodes_per_second):
        print(f"{door:<14} {label}{share:>6.0%} of {floor:<16} ({episodes_per_second[door]:.1f} /"
              f" {episodes_per_second[floor]:.1f} episodes/s)")


# --- the servers -------------------------------------------------------------

async def _sse(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=_SSE_ANSWER, content_type="text/event-stream")


async def serve_http() -> None:
    app = web.Application()
    app.router.add_post("/{tail:.*}", _sse)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
    await site.start()
    print(f"HTTP listening on 127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


async def _echo_stream(requests, context) -> None:
    async for message in requests:
        yield message


async def _echo(request: bytes, context) -> bytes:
    return request


async def serve_grpc() -> None:
    handlers = grpc.method_handlers_generic_handler("floor.Echo", {
        "Stream": grpc.stream_stream_rpc_method_handler(_echo_stream),
        "Unary": grpc.unary_unary_rpc_method_handler(_echo),
    })
    server = grpc.aio.server(handlers=[handlers])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"gRPC listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


def main(argv: list[str]) -> None:
    import uvloop
    serve = {"http": serve_http, "grpc": serve_grpc}[argv[0]]
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve())


# --- the load generator's doors ----------------------------------------------

class HttpFloorDoor(PooledHttp):
    """Ten POSTs with a small JSON body per episode, each answered by a 2-event SSE."""

    async def episode(self, on_tool_call: Callable[[float], None], on_create: Callable[[float], None]) -> None:
        for n in range(HTTP_REQUESTS):
            start = time.perf_counter()
            async with self.http.post("/benchenv/call", json={"name": "step", "input": {"n": n}},
                                      headers=SSE_ACCEPT) as resp:
                body = await resp.read()
            if resp.status != 200 or [event for event, _ in parse_sse(body)] != ["task_id", "end"]:
                raise RuntimeError(f"floor answered {resp.status} {body[:200]!r}")
            if n in TOOL_CALLS:
                on_tool_call(time.perf_counter() - start)


class _GrpcFloorDoor:
    def __init__(self, target: str):
        self.target = target
        self.channel: grpc.aio.Channel | None = None

    async def __aenter__(self):
        self.channel = grpc.aio.insecure_channel(self.target)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.channel.close()


class StreamFloorDoor(_GrpcFloorDoor):
    """Eight round trips per episode on a bidirectional echo stream kept for the next episode."""

    def __init__(self, target: str):
        super().__init__(target)
        self.idle: list = []

    async def episode(self, on_tool_call: Callable[[float], None], on_create: Callable[[float], None]) -> None:
        call = self.idle.pop() if self.idle else self.channel.stream_stream(_STREAM)()
        for n in range(STREAM_STEPS):
            start = time.perf_counter()
            await call.write(_MESSAGE)
            if await call.read() != _MESSAGE:
                raise RuntimeError("the echo stream answered something else")
            if n in TOOL_CALLS:
                on_tool_call(time.perf_counter() - start)
        self.idle.append(call)


class UnaryFloorDoor(_GrpcFloorDoor):
    """Ten unary echo RPCs per episode."""

    async def episode(self, on_tool_call: Callable[[float], None], on_create: Callable[[float], None]) -> None:
        echo = self.channel.unary_unary(_UNARY)
        for n in range(UNARY_CALLS):
            start = time.perf_counter()
            if await echo(_MESSAGE) != _MESSAGE:
                raise RuntimeError("the echo RPC answered something else")
            if n in TOOL_CALLS:
                on_tool_call(time.perf_counter() - start)


def make_floor_door(kind: str, target: str):
    return {"floor-http": HttpFloorDoor, "floor-grpc": StreamFloorDoor, "floor-grpc-unary": UnaryFloorDoor}[kind](
        target)


if __name__ == "__main__":
    main(sys.argv[1:])
