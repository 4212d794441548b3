"""TLS on both doors of `ors-grpc serve --tls-cert F --tls-key F --http-port P`,
and on both hops of `ors-grpc bridge` alone, with a self-signed certificate
made in the test: gRPC over TLS, HTTPS, and plaintext refused.

TLS of the gRPC server alone: tests/service/test_server.py::test_tls_from_certificate_files.
"""

from __future__ import annotations

import json
import shutil
import ssl
from pathlib import Path

import aiohttp
import grpc
import pytest

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from tests.support.reliability_helpers import PROBE_ENVIRONMENTS, grpc_call_request
from tests.support.servers import start_bridge, start_serve
from tests.support.tooling import make_self_signed_certificate

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed"),
]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1, and its key."""
    return make_self_signed_certificate(tmp_path_factory.mktemp("tls"))


async def _https_episode(https_url: str, trust: ssl.SSLContext, tag: str) -> None:
    async with aiohttp.ClientSession(base_url=https_url, connector=aiohttp.TCPConnector(ssl=trust)) as https:
        body = {"env_name": "probeenv", "task_spec": {"tag": tag}}
        async with https.post("/create", json=body, headers={"X-Session-ID": tag}) as response:
            assert response.status == 200, await response.text()
        call = {"name": "echo_tag", "input": {}}
        async with https.post("/probeenv/call", json=call, headers={"X-Session-ID": tag}) as response:
            assert f'"text":"{tag}"' in await response.text()
        async with https.post("/delete", headers={"X-Session-ID": tag}) as response:
            assert response.status == 200


async def _plaintext_http_is_refused(http_url: str) -> None:
    async with aiohttp.ClientSession(base_url=http_url) as plaintext:
        with pytest.raises(aiohttp.ClientError):
            async with plaintext.get("/health") as response:
                await response.read()


async def test_both_doors_serve_tls_from_the_command_line_certificate(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    with start_serve(*PROBE_ENVIRONMENTS, "--http-port", "0", "--tls-cert", str(cert), "--tls-key", str(key)) as serve:
        https_url = serve.http_url.replace("http://", "https://")
        trust = ssl.create_default_context(cafile=str(cert))

        # HTTPS: a whole episode, through the bridge's TLS hop to the gRPC port.
        await _https_episode(https_url, trust, "over-https")
        await _plaintext_http_is_refused(serve.http_url)

        # gRPC over TLS: a whole episode; plaintext is refused.
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        async with grpc.aio.secure_channel(serve.grpc_target, credentials) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            request = pb.CreateEpisodeRequest(session_id="tls-grpc", env_name="probeenv")
            request.task_spec.json = json.dumps({"tag": "over-grpc-tls"})
            await stub.CreateEpisode(request)
            events = [event async for event in stub.CallTool(grpc_call_request("tls-grpc", "echo_tag"))]
            assert events[-1].result.output.blocks[0].text.text == "over-grpc-tls"
            await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id="tls-grpc"))
            assert (await stub.Health(pb.HealthRequest())).open_sessions == 0
        async with grpc.aio.insecure_channel(serve.grpc_target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await pb_grpc.EnvironmentServiceStub(channel).Health(pb.HealthRequest(), timeout=5)
            assert caught.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_the_bridge_alone_serves_https_and_reaches_a_tls_backend(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
    with start_serve(*PROBE_ENVIRONMENTS, *tls) as backend:
        backend_tls = ["--backend-tls-root-cert", str(cert), "--backend-tls-server-name", "localhost"]
        with start_bridge(backend.grpc_target, *tls, *backend_tls) as bridge:
            trust = ssl.create_default_context(cafile=str(cert))
            await _https_episode(bridge.http_url.replace("http://", "https://"), trust, "bridge-over-tls")
            await _plaintext_http_is_refused(bridge.http_url)
