"""The Python client's API key (argument or ORS_API_KEY) and TLS credentials, against in-process servers."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import grpc
import pytest

from ors_grpc.client import AsyncORSClient, ORSClient, ORSServerError, TextBlock
from ors_grpc.server import ServerConfig, create_server
from tests.support.environments import EchoEnv
from tests.support.tooling import make_self_signed_certificate

pytestmark = pytest.mark.timeout(60)

API_KEY = "client-test-key"


async def test_the_api_key_travels_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORS_API_KEY", raising=False)
    server, port = await create_server([EchoEnv], config=ServerConfig(api_key=API_KEY))
    target = f"127.0.0.1:{port}"
    try:
        async with AsyncORSClient(target) as keyless:
            with pytest.raises(ORSServerError) as refused:
                await keyless.environment("echoenv").list_splits()
            assert refused.value.reason == "ERROR_REASON_UNAUTHENTICATED"
            assert API_KEY not in str(refused.value)

        async with AsyncORSClient(target, API_KEY) as client:
            async with client.environment("echoenv").session(split="train", index=0) as session:
                assert (await session.call_tool("echo", {"text": "k"})).blocks == [TextBlock(text="k")]

        monkeypatch.setenv("ORS_API_KEY", API_KEY)
        async with AsyncORSClient(target) as from_environment:
            assert len(await from_environment.environment("echoenv").list_splits()) == 2
    finally:
        await server.stop(None)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
async def test_tls_credentials(tmp_path: Path) -> None:
    cert, key = make_self_signed_certificate(tmp_path)
    server, port = await create_server([EchoEnv], config=ServerConfig(tls_cert=str(cert), tls_key=str(key)))
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        # The sync client, from a worker thread so as not to block this test's event loop.
        with ORSClient(f"localhost:{port}", credentials=credentials) as client:
            health = await _in_thread(client.health)
        assert health.status == "ok"
    finally:
        await server.stop(None)


async def _in_thread(function):
    return await asyncio.get_running_loop().run_in_executor(None, function)
