"""`ors-grpc bridge` alone in front of a `serve` backend that goes away and comes back."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.support.bridge_http import call, create_episode, parse_sse
from tests.support.servers import start_bridge, start_serve

ENVIRONMENT = "tests.support.environments:EchoEnv"
RECOVERY_ATTEMPTS = 100  # x 0.1 s: the channel's reconnect backoff is capped at 1 s
#: How late the slow link delivers a new connection's first bytes: past the reconnect backoff's cap (1 s),
#: as a TLS handshake over a long-haul link, or a backend on a machine that busy, can take.
SLOW_LINK_DELAY_S = 1.5


async def wait_until_served(http: aiohttp.ClientSession, path: str) -> int:
    """Poll `path` until it is not a 503 (bounded); its final status."""
    for _ in range(RECOVERY_ATTEMPTS):
        async with http.get(path) as response:
            if response.status != 503:
                return response.status
        await asyncio.sleep(0.1)
    return 503


async def test_backend_down_is_503_with_retry_after_and_the_bridge_recovers() -> None:
    with start_serve(ENVIRONMENT) as backend:
        backend_port = backend.grpc_target.rsplit(":", 1)[1]
        with start_bridge(backend.grpc_target) as bridge:
            async with aiohttp.ClientSession(base_url=bridge.http_url) as http:
                sid = await create_episode(http, {"split": "train", "index": 0})
                assert (await call(http, sid, "echo", {"text": "up"})).result()["ok"] is True

                backend.stop()
                for path in ("/list_environments", "/echoenv/splits", "/health"):
                    async with http.get(path) as response:
                        assert response.status == 503, path
                        assert response.headers["Retry-After"] == "1"
                        detail = (await response.json())["detail"]
                        assert "unavailable" in detail and backend_port not in detail
                async with http.post("/echoenv/call", json={"name": "echo", "input": {}}, headers={"X-Session-ID": sid}) as response:
                    assert response.status == 503

                with start_serve(ENVIRONMENT, "--port", backend_port):
                    assert await wait_until_served(http, "/list_environments") == 200
                    # A new backend: the old session is gone, new ones work.
                    async with http.get("/echoenv/prompt", headers={"X-Session-ID": sid}) as response:
                        assert response.status == 404
                    sid = await create_episode(http, {"split": "train", "index": 1})
                    assert (await call(http, sid, "echo", {"text": "back"})).result()["ok"] is True


async def test_a_call_in_flight_when_the_backend_dies_ends_without_a_result() -> None:
    with start_serve(ENVIRONMENT) as backend, start_bridge(backend.grpc_target) as bridge:
        async with aiohttp.ClientSession(base_url=bridge.http_url) as http:
            sid = await create_episode(http, {"split": "train", "index": 0})
            body = {"name": "sleep", "input": {"seconds": 30}}
            async with http.post("/echoenv/call", json=body, headers={"X-Session-ID": sid}) as response:
                assert await response.content.readline() == b"event: task_id\n"
                backend.proc.kill()  # a crash, not a graceful stop
                rest = parse_sse((await response.content.read()).decode())
            # No `end` and no `error`: the clients treat that as a dropped
            # stream and retry with the task id, rather than giving up.
            assert [name for name in rest.names() if name in ("end", "error")] == []


async def _slow_link(backend_target: str, delay_s: float) -> asyncio.AbstractServer:
    """A TCP relay to `backend_target` that starts relaying each connection `delay_s` after it came."""
    host, port = backend_target.rsplit(":", 1)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(delay_s)
        backend_reader, backend_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(client_reader, backend_writer), pipe(backend_reader, client_writer))

    return await asyncio.start_server(relay, "127.0.0.1", 0)


async def test_a_backend_slow_to_connect_is_waited_for_not_answered_503() -> None:
    # A connection attempt may take as long as the link needs (gRPC's connect timeout, 20 s),
    # not the 100 ms that made every attempt over a slower link fail, and the door answer 503.
    with start_serve(ENVIRONMENT) as backend:
        link = await _slow_link(backend.grpc_target, SLOW_LINK_DELAY_S)
        async with link:
            link_port = link.sockets[0].getsockname()[1]
            with start_bridge(f"127.0.0.1:{link_port}") as bridge:
                async with aiohttp.ClientSession(base_url=bridge.http_url) as http:
                    async with http.get("/list_environments") as response:
                        assert (response.status, await response.json()) == (200, ["echoenv"])
