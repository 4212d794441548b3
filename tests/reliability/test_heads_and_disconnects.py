"""The HTTP port against heads too large and clients that vanish, on both
HTTP doors (`serve --http-port` and the standalone `ors-grpc bridge`):

- 24 request heads of 15 MB at once (120 header lines of 127 KiB, each under
  the per-line limit) are answered 431 with a JSON `detail`, and the
  server's memory (RSS) grows less than 50 MB; a 64 KiB `X-Secrets` is still
  admitted;
- a client that disconnects mid-body, mid-SSE, during a scoring or mid
  RunEpisode stream leaves no ERROR line and no traceback in the log.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
from pathlib import Path
from typing import Iterator

import aiohttp
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc.protocol.constants import MAX_REQUEST_HEADERS
from tests.support.reliability_helpers import Door, Doors, both_doors, grpc_stub

pytestmark = pytest.mark.timeout(300)

ENVIRONMENTS = ("tests.support.reliability_environments:LimitsEnv",)
ENV = "limitsenv"
HEADS = 24
LINES, LINE_BYTES = 120, 127 * 1024
RSS_GROWTH_LIMIT_BYTES = 50 * 1024 * 1024


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    with both_doors(tmp_path_factory.mktemp("heads"), ENVIRONMENTS) as running:
        yield running


def _address(door: Door) -> tuple[str, int]:
    host, port = door.http_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _send_head_and_read(address: tuple[str, int], head: bytes, answers: list[bytes]) -> None:
    """Send `head` while reading the answer (the server answers before the head is all in)."""
    with socket.create_connection(address, timeout=60) as sock:
        received = bytearray()

        def read() -> None:
            try:
                while chunk := sock.recv(65536):
                    received.extend(chunk)
            except OSError:
                pass

        reader = threading.Thread(target=read)
        reader.start()
        try:
            sock.sendall(head)
        except OSError:
            pass  # the server closed the connection once it had answered
        reader.join(60)
        answers.append(bytes(received))


def _huge_head() -> bytes:
    lines = b"".join(b"X-Filler-%d: %s\r\n" % (index, b"f" * LINE_BYTES) for index in range(LINES))
    return b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + lines + b"\r\n"


def _status_and_detail(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"application/json" in head, answer[:300]
    return int(head.split()[1]), json.loads(body)["detail"]


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
def test_24_heads_of_15_mb_are_431_and_the_server_grows_less_than_50_mb(doors: Doors, door_index: int) -> None:
    door = doors.http[door_index]
    head = _huge_head()
    assert len(head) > 15_000_000
    before = _rss_bytes(door.pid)
    answers: list[bytes] = []
    senders = [threading.Thread(target=_send_head_and_read, args=(_address(door), head, answers))
               for _ in range(HEADS)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(120)
    growth = _rss_bytes(door.pid) - before
    assert growth < RSS_GROWTH_LIMIT_BYTES, f"RSS grew {growth / 2**20:.1f} MB"
    print(f"{door.name}: RSS growth {growth / 2**20:.1f} MB after {HEADS} heads of {len(head) / 1e6:.1f} MB")
    assert len(answers) == HEADS
    for answer in answers:
        status, detail = _status_and_detail(answer)
        assert status == 431 and "Request head too large" in detail, answer[:300]


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
def test_too_many_header_lines_are_431_and_a_64_kib_x_secrets_is_admitted(doors: Doors, door_index: int) -> None:
    door = doors.http[door_index]
    answers: list[bytes] = []
    lines = b"".join(b"X-H-%d: v\r\n" % index for index in range(MAX_REQUEST_HEADERS + 1))
    _send_head_and_read(_address(door), b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + lines + b"\r\n", answers)
    assert _status_and_detail(answers[0]) == (431, f"Too many request headers (limit {MAX_REQUEST_HEADERS})")

    secrets = {"BIG": {"value": "k" * (64 * 1024)}}
    header = base64.b64encode(json.dumps(secrets).encode()).decode()
    body = json.dumps({"env_name": ENV, "task_spec": {"tag": "t"}}).encode()
    request = (f"POST /create HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Session-ID: big-secrets-{door_index}\r\n"
               f"X-Secrets: {header}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    answers.clear()
    _send_head_and_read(_address(door), request.encode() + body, answers)
    assert answers[0].startswith(b"HTTP/1.1 200"), answers[0][:300]


# ----------------------------------------------------------------------------
# Clients that vanish
# ----------------------------------------------------------------------------

BODY_ROUTES = ("/create", f"/{ENV}/call", f"/{ENV}/score_group", f"/{ENV}/task_tools", f"/{ENV}/prepare")


def _log_size(door: Door) -> int:
    return door.log.stat().st_size


def _new_log(door: Door, since: int) -> str:
    return door.log.read_bytes()[since:].decode("utf-8", "replace")


async def _http_session(http: aiohttp.ClientSession) -> str:
    async with http.post("/create_session") as response:
        sid = (await response.json())["sid"]
    async with http.post("/create", json={"env_name": ENV, "task_spec": {"tag": "t"}},
                         headers={"X-Session-ID": sid}) as response:
        assert response.status == 200
    return sid


async def _disconnect_mid_body(address: tuple[str, int], path: str, sid: str) -> None:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Session-ID: {sid}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: 1000\r\n\r\n{{\"name\": \"ec".encode())
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    await writer.wait_closed()


async def _wait_for_line(door: Door, since: int, text: str, count: int) -> None:
    for _ in range(200):
        if _new_log(door, since).count(text) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {count} {text!r} lines")


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
async def test_50_disconnects_mid_body_log_no_error(doors: Doors, door_index: int) -> None:
    door = doors.http[door_index]
    async with aiohttp.ClientSession(door.http_url) as http:
        sid = await _http_session(http)
    since = _log_size(door)
    for index in range(50):
        await _disconnect_mid_body(_address(door), BODY_ROUTES[index % len(BODY_ROUTES)], sid)
    await _wait_for_line(door, since, "http_client_disconnected", 50)
    log = _new_log(door, since)
    assert "level=ERROR" not in log and "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize("door_index", [0, 1], ids=["serve", "bridge"])
async def test_disconnects_mid_sse_and_during_a_scoring_log_no_error(doors: Doors, door_index: int) -> None:
    door = doors.http[door_index]
    since = _log_size(door)
    async with aiohttp.ClientSession(door.http_url) as http:
        sid = await _http_session(http)
        for path, body in ((f"/{ENV}/call", {"name": "slow", "input": {"seconds": 0.5}}),
                           (f"/{ENV}/score_group", {"candidates": [{"messages": [], "metadata": {"seconds": 0.5}}]})):
            for _ in range(5):
                async with http.post(path, json=body, headers={"X-Session-ID": sid}) as response:
                    assert await response.content.readline() == b"event: task_id\n"
                    response.close()  # gone mid-stream, the work still running
        await asyncio.sleep(1.0)  # the work ends with nobody to tell
        async with http.get("/health") as response:
            assert response.status == 200
    log = _new_log(door, since)
    assert "level=ERROR" not in log and "Traceback" not in log, log[-3000:]


async def test_a_run_episode_stream_cancelled_mid_step_logs_no_error(doors: Doors) -> None:
    since = _log_size(doors.http[0])
    async with grpc_stub(doors.grpc_target) as stub:
        for _ in range(5):
            create = pb.RunEpisodeRequest()
            create.create.env_name, create.create.task_spec.json = ENV, '{"tag":"t"}'
            call = pb.RunEpisodeRequest()
            call.call_tool.name, call.call_tool.task_id, call.call_tool.input.json = "slow", "s", '{"seconds":0.5}'
            stream = stub.RunEpisode(iter([create, call]))
            assert (await stream.read()).WhichOneof("step") == "create"
            stream.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stream.read()
        await asyncio.sleep(1.0)
        assert (await stub.Health(pb.HealthRequest())).status == "ok"
    log = _new_log(doors.http[0], since)
    assert "level=ERROR" not in log and "Traceback" not in log, log[-3000:]
