"""What every door shares on its way to the gRPC service: the channel to a
remote backend, the gRPC metadata of an HTTP request (API key, routing key),
the `X-Secrets` header, the trailers of a failed RPC, and the backend's
environment names (cached per API key)."""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as service_pb2
from ors_grpc._generated.ors.v1.environment_service_pb2_grpc import EnvironmentServiceStub
from ors_grpc.protocol import json_text
from ors_grpc.protocol.constants import (
    API_KEY_HEADER, API_KEY_METADATA_KEY, ERROR_REASON_METADATA_KEY, SESSION_ID_METADATA_KEY,
)

__all__ = ["EnvNames", "Metadata", "api_key_of", "call_metadata", "error_reason", "open_channel", "retry_after",
           "secrets_from_header", "with_session_id"]

logger = logging.getLogger("ors_grpc.door")

Metadata = tuple[tuple[str, str], ...]


def open_channel(
    target: str,
    *,
    max_message_bytes: int,
    tls_root_cert: Optional[str] = None,
    tls_server_name: Optional[str] = None,
) -> grpc.aio.Channel:
    """One long-lived channel to the backend, quick to reconnect after an outage."""
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        # gRPC's default reconnect backoff grows to 120 s; a door in front
        # of a restarted backend should be back within a second or so.
        # (Not `grpc.min_reconnect_backoff_ms`: despite its name it is the
        # connect timeout, and an attempt that takes longer, a TLS handshake
        # over a slow link or on a busy machine, fails: gRPC's 20 s stays.)
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        # Notice a silently dead backend (no RST) during long tool calls.
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 0),
    ]
    logger.debug("backend_channel target=%s tls=%s", target, tls_root_cert is not None)
    if tls_root_cert is None:
        return grpc.aio.insecure_channel(target, options=options)
    if tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls_server_name))
    credentials = grpc.ssl_channel_credentials(root_certificates=Path(tls_root_cert).read_bytes())
    return grpc.aio.secure_channel(target, credentials, options=options)


def _printable_ascii(value: str) -> bool:
    return value.isascii() and value.isprintable()


def api_key_of(headers: Mapping[str, str]) -> str:
    """The API key an HTTP request carries: `X-API-Key`, else `Authorization: Bearer KEY` ("" for none)."""
    api_key = headers.get(API_KEY_HEADER) or headers.get(API_KEY_METADATA_KEY)
    if api_key:
        return api_key
    scheme, _, token = (headers.get("Authorization") or headers.get("authorization") or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def call_metadata(headers: Mapping[str, str], session_id: Optional[str] = None) -> Metadata:
    """The gRPC metadata of an HTTP request, through an explicit allowlist.

    The API key (`api_key_of`) becomes `x-api-key`, so one key check guards
    every door; the session id becomes `x-session-id` for session-affine load
    balancing. Values gRPC cannot carry are left out: the session id still
    travels in the request message, and a missing key is refused by the
    backend as it should be.
    """
    api_key = api_key_of(headers)
    metadata: Metadata = ((API_KEY_METADATA_KEY, api_key),) if api_key and _printable_ascii(api_key) else ()
    return with_session_id(metadata, session_id)


def with_session_id(metadata: Metadata, session_id: Optional[str]) -> Metadata:
    """`metadata` (a request's `call_metadata` without a session id) with `session_id`'s routing entry."""
    if session_id and _printable_ascii(session_id):
        return (*metadata, (SESSION_ID_METADATA_KEY, session_id))
    return metadata


def secrets_from_header(header: Optional[str]) -> dict[str, str]:
    """Secrets from `X-Secrets`: base64 JSON `{"NAME": {"value": ...}}` or `{"NAME": "..."}`.
    ValueError (naming a secret, never showing a value) when the header is not of that form;
    `json_text.JsonLimitError` when its JSON breaks the JSON rules (depth, NaN);
    UnicodeEncodeError for text protobuf cannot carry (a lone surrogate)."""
    if not header:
        return {}
    try:
        decoded = base64.b64decode(header.strip(), validate=True)
        payload = json_text.loads(decoded, "X-Secrets")
    except json_text.JsonLimitError:
        raise
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ValueError("X-Secrets header must be base64 of a JSON object") from None
    if not isinstance(payload, dict):
        raise ValueError("X-Secrets header must be base64 of a JSON object")
    secrets = {}
    for name, entry in payload.items():
        value = entry.get("value") if isinstance(entry, dict) else entry
        if not isinstance(value, str):
            # Name the secret, never its value.
            raise ValueError(f"X-Secrets: secret {name!r} has no string value")
        name.encode("utf-8")
        value.encode("utf-8")
        secrets[name] = value
    return secrets


def error_reason(error: grpc.aio.AioRpcError) -> Optional[str]:
    """The `ors-error-reason` trailing metadata entry of a failed RPC, if any."""
    return _trailer(error, ERROR_REASON_METADATA_KEY)


def retry_after(error: grpc.aio.AioRpcError) -> Optional[str]:
    """The `retry-after` trailing metadata entry (seconds) of a failed RPC, if any."""
    return _trailer(error, "retry-after")


def _trailer(error: grpc.aio.AioRpcError, name: str) -> Optional[str]:
    for key, value in error.trailing_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else value.decode()
    return None


class EnvNames:
    """The backend's environment names, cached briefly for the default-env redirect.

    Not session state: the list only changes when the backend is redeployed.
    Cached per API key, so that only a key the backend accepted is answered
    from the cache: a request without the key gets the backend's 401, not a
    redirect naming the environments.
    """

    #: Distinct keys cached at most (keys are arbitrary when none is required).
    MAX_KEYS = 16

    def __init__(self, stub: EnvironmentServiceStub, ttl_s: float) -> None:
        self._stub = stub
        self._ttl_s = ttl_s
        self._by_key: dict[str, tuple[float, list[str]]] = {}

    def cached(self, metadata: Metadata) -> Optional[list[str]]:
        """The names fetched under this metadata's API key within the TTL (None: `get` asks the backend)."""
        entry = self._by_key.get(_api_key_entry(metadata))
        if entry is None or time.monotonic() - entry[0] > self._ttl_s:
            return None
        return entry[1]

    async def get(self, metadata: Metadata) -> list[str]:
        names = self.cached(metadata)
        if names is None:
            response = await self._stub.ListEnvironments(service_pb2.ListEnvironmentsRequest(), metadata=metadata)
            names = [name.lower() for name in response.names]
            if len(self._by_key) >= self.MAX_KEYS:
                self._by_key.clear()
            self._by_key[_api_key_entry(metadata)] = (time.monotonic(), names)
        return names


def _api_key_entry(metadata: Metadata) -> str:
    """The `x-api-key` entry of a request's metadata ("" without one)."""
    for key, value in metadata:
        if key == API_KEY_METADATA_KEY:
            return value
    return ""
