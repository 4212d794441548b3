"""One RunEpisode call: an episode's steps over a single bidirectional stream.

Steps go one at a time, each answered by one response. A stream whose step
did not complete (the RPC failed, or the caller was cancelled between a step
and its answer) is out of step and is cancelled: the session then carries on
over the per-step RPCs, which reach the same episode by its session id.
"""

from __future__ import annotations

import asyncio

import grpc

from .._generated.ors.v1 import environment_service_pb2 as pb

__all__ = ["EpisodeStream"]


class EpisodeStream:
    """Sends steps and reads their answers; usable while not `broken`."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self._call = call
        self._lock = asyncio.Lock()
        self.broken = False

    @property
    def free(self) -> bool:
        """Neither broken nor in the middle of another step."""
        return not self.broken and not self._lock.locked()

    async def ask(self, request: pb.RunEpisodeRequest) -> pb.RunEpisodeResponse:
        """One step and its answer. Raises AioRpcError when the stream failed or ended early."""
        async with self._lock:
            try:
                await self._call.write(request)
                answer = await self._call.read()
            except BaseException:
                self.cancel()
                raise
        if answer is grpc.aio.EOF:
            self.cancel()
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(),
                details="the RunEpisode stream ended before answering",
            )
        return answer

    async def delete_episode(self, timeout: float) -> bool:
        """A `delete` step, then the end of the stream; True once the server
        deleted the episode. A broken or busy stream is cancelled instead
        (False): the caller deletes the episode by RPC."""
        if not self.free:
            self.cancel()
            return False
        try:
            async with asyncio.timeout(timeout):
                answer = await self.ask(pb.RunEpisodeRequest(delete=pb.DeleteEpisodeRequest()))
                await self._call.done_writing()
                await self._call.read()  # EOF: the server ends the stream with OK
        except (grpc.aio.AioRpcError, TimeoutError):
            self.cancel()
            return False
        self.broken = True  # ended: no more steps
        return answer.WhichOneof("step") == "delete"

    def cancel(self) -> None:
        self.broken = True
        self._call.cancel()
