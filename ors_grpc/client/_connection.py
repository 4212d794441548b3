"""One grpc.aio channel to an ORS server, and the metadata every call carries."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Optional

import grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc
from ors_grpc.client._episode_stream import EpisodeStreamPool
from ors_grpc.client.errors import ORSServerError
from ors_grpc.protocol.constants import API_KEY_METADATA_KEY, DEFAULT_MAX_MESSAGE_BYTES, SESSION_ID_METADATA_KEY

#: Bounds ending an idle RunEpisode stream.
_END_STREAM_TIMEOUT_S = 10.0

Metadata = tuple[tuple[str, str], ...]

#: RPCs that may run twice without harm: grpc retries them when the server
#: answers UNAVAILABLE (restarting, or a proxy without a live backend).
#: Not CreateEpisode (a second try would find the first one's session),
#: CallTool (reattached by task id instead) nor RunEpisode.
IDEMPOTENT_RPCS = (
    "Health", "Version", "ListEnvironments", "ListTools", "ListSplits", "ListTasks", "NumTasks", "GetTask",
    "GetTaskRange", "CreateSessionId", "GetPrompt", "ListTaskTools", "Ping", "DeleteEpisode", "DeleteSessionId",
    "GetMessages",
)
RETRY_SERVICE_CONFIG = json.dumps({
    "methodConfig": [{
        "name": [{"service": "ors.v1.EnvironmentService", "method": method} for method in IDEMPOTENT_RPCS],
        "retryPolicy": {
            "maxAttempts": 5,
            "initialBackoff": "0.1s",
            "maxBackoff": "2s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }],
})


class Connection:
    """A lazily opened channel (grpc.aio binds it to the event loop it is first used on)."""

    def __init__(
        self,
        target: str,
        api_key: Optional[str],
        credentials: Optional[grpc.ChannelCredentials],
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.target = target
        self._api_key = api_key
        self._credentials = credentials
        self._options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.service_config", RETRY_SERVICE_CONFIG),
        ]
        self._channel: Optional[grpc.aio.Channel] = None
        self._stub: Optional[environment_service_pb2_grpc.EnvironmentServiceStub] = None
        #: Sessions (AsyncSession) whose episode is open: `close` ends them first.
        self.open_sessions: set[Any] = set()
        #: The RPCs (CallTool, ScoreGroup) the server has run under the
        #: idempotency key it was given (an ors-grpc with keys for them): such
        #: a stream that breaks before its task id arrives may be sent again.
        self.rpcs_honouring_keys: set[str] = set()
        self.episode_streams = EpisodeStreamPool(self._run_episode_call, _END_STREAM_TIMEOUT_S)

    @property
    def stub(self) -> environment_service_pb2_grpc.EnvironmentServiceStub:
        if self._stub is None:
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
            else:
                self._channel = grpc.aio.secure_channel(self.target, self._credentials, options=self._options)
            self._stub = environment_service_pb2_grpc.EnvironmentServiceStub(self._channel)
        return self._stub

    def metadata(self, route_key: Optional[str] = None) -> Metadata:
        """`x-api-key` when configured; on session calls `x-session-id`, by
        which load balancers route a session's calls to one backend (see
        AsyncSession: usually the session's own id)."""
        entries: list[tuple[str, str]] = []
        if self._api_key:
            entries.append((API_KEY_METADATA_KEY, self._api_key))
        if route_key:
            entries.append((SESSION_ID_METADATA_KEY, route_key))
        return tuple(entries)

    async def unary(
        self, method: str, request: Any, *, route_key: Optional[str] = None, timeout: Optional[float] = None
    ) -> Any:
        """Calls a unary RPC of the stub by name; a failure raises ORSServerError."""
        rpc = getattr(self.stub, method)
        try:
            return await rpc(request, metadata=self.metadata(route_key), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise ORSServerError.from_rpc_error(error) from None

    def call_tool_stream(self, request: Any, route_key: str) -> grpc.aio.UnaryStreamCall:
        """The raw CallTool stream: its AioRpcError is the caller's to classify (break or failure)."""
        return self.stub.CallTool(request, metadata=self.metadata(route_key))

    def score_group_stream(self, request: Any, route_key: str) -> grpc.aio.UnaryStreamCall:
        """The raw ScoreGroup stream, as `call_tool_stream`."""
        return self.stub.ScoreGroup(request, metadata=self.metadata(route_key))

    def _run_episode_call(self, route_key: str) -> grpc.aio.StreamStreamCall:
        """A RunEpisode call routed by `route_key` (an episode's session id, as `x-session-id`)."""
        return self.stub.RunEpisode(metadata=self.metadata(route_key))

    async def wait_ready(self, timeout: float) -> None:
        """Waits up to `timeout` for the channel to (re)connect; a reattach after
        a lost connection would otherwise fail fast while the channel backs off."""
        self.stub  # opens the channel if needed
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            pass  # the next call fails with UNAVAILABLE and is counted as an attempt

    async def close(self) -> None:
        """Ends the episodes still open on this connection (nothing is left to
        the server's reaper), then closes the channel."""
        await asyncio.gather(*(session.close() for session in list(self.open_sessions)))
        await self.episode_streams.close()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None
