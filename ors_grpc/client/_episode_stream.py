"""RunEpisode calls: an episode's steps over a single bidirectional stream,
and the idle streams a connection keeps for its next episodes.

Steps go one at a time, each answered by one response. A stream whose step
did not complete (the RPC failed, or the caller was cancelled between a step
and its answer) is out of step and is cancelled: the session then carries on
over the per-step RPCs, which reach the same episode by its session id.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc.protocol.constants import SESSION_ID_METADATA_KEY

__all__ = ["EpisodeStream", "EpisodeStreamPool"]

#: Idle streams kept per connection, and for how long: long enough for a
#: training loop's next episode, short enough not to hold up a server's
#: graceful stop (it waits for open calls).
MAX_IDLE_STREAMS = 256
IDLE_STREAM_S = 1.0


class EpisodeStream:
    """Sends steps and reads their answers; usable while not `broken`.

    `route_key` is the `x-session-id` the stream was opened with: a load
    balancer sent the whole stream to the backend that key chose, so every
    session created on it sends that key with its per-step RPCs too. Once
    answered, it is the key the server answered in its initial metadata: a
    proxy with stateful sessions (Envoy) names in it the backend it chose, so
    those RPCs reach that backend even after its hash table changed.
    """

    def __init__(self, call: grpc.aio.StreamStreamCall, route_key: str) -> None:
        self.route_key = route_key
        self._answered = False
        self._call = call
        #: A step is in flight (callers take a `free` stream: steps never queue).
        self._busy = False
        self.broken = False
        self.reused = False
        self.idle_timer: asyncio.TimerHandle | None = None

    @property
    def free(self) -> bool:
        """Open (not broken, not ended by the server or a proxy) and not in the middle of another step."""
        return self.open and not self._busy

    @property
    def open(self) -> bool:
        """Not broken, and the server has not ended the call."""
        return not self.broken and not self._call.done()

    async def ask(self, request: pb.RunEpisodeRequest) -> pb.RunEpisodeResponse:
        """One step and its answer, on a `free` stream. Raises AioRpcError when the stream failed or ended early."""
        if self._busy:
            raise RuntimeError("a RunEpisode stream carries one step at a time: take a free one")
        self._busy = True
        try:
            await self._call.write(request)
            answer = await self._call.read()
            if not self._answered and answer is not grpc.aio.EOF:
                self._answered = True
                self._adopt_route_key(await self._call.initial_metadata())
        except asyncio.InvalidStateError:  # the call ended meanwhile (its backend died, say)
            self.cancel()
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                details="the RunEpisode stream had ended",
            ) from None
        except BaseException:
            self.cancel()
            raise
        finally:
            self._busy = False
        if answer is grpc.aio.EOF:
            self.cancel()
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(),
                details="the RunEpisode stream ended before answering",
            )
        return answer

    def _adopt_route_key(self, metadata: grpc.aio.Metadata | None) -> None:
        for key, value in metadata or ():
            if key == SESSION_ID_METADATA_KEY and isinstance(value, str) and value:
                self.route_key = value
                return

    async def delete_episode(self, timeout: float) -> bool:
        """A `delete` step; True once the server deleted the episode (the
        stream can then carry another). A broken or busy stream is cancelled
        instead (False): the caller deletes the episode by RPC."""
        if not self.free:
            self.cancel()
            return False
        try:
            async with asyncio.timeout(timeout):
                answer = await self.ask(pb.RunEpisodeRequest(delete=pb.DeleteEpisodeRequest()))
        except (grpc.aio.AioRpcError, TimeoutError):
            self.cancel()
            return False
        return answer.WhichOneof("step") == "delete"

    async def end(self, timeout: float) -> None:
        """Half-closes the stream and waits for the server to end it."""
        self.broken = True  # no more steps
        try:
            async with asyncio.timeout(timeout):
                await self._call.done_writing()
                await self._call.read()  # EOF: the server ends the stream with OK
        except (grpc.aio.AioRpcError, TimeoutError):
            self._call.cancel()

    def cancel(self) -> None:
        self.broken = True
        self._call.cancel()


class EpisodeStreamPool:
    """The idle streams of one connection: a new episode takes one (sparing
    the cost of opening a call) or opens a stream of its own."""

    def __init__(self, open_call: Callable[[str], grpc.aio.StreamStreamCall], end_timeout_s: float) -> None:
        self._open_call = open_call
        self._end_timeout_s = end_timeout_s
        self._idle: list[EpisodeStream] = []
        self._ending: set[asyncio.Task[None]] = set()

    def take(self, route_key: str, *, reuse: bool = True) -> EpisodeStream:
        """An idle stream (`reused`) if `reuse`, else a new one opened with `route_key`."""
        while reuse and self._idle:
            stream = self._idle.pop()
            if stream.idle_timer is not None:
                stream.idle_timer.cancel()
            if stream.open:
                stream.reused = True
                return stream
        return EpisodeStream(self._open_call(route_key), route_key)

    def give_back(self, stream: EpisodeStream) -> None:
        """Keeps a stream whose episode was deleted, for a while."""
        if len(self._idle) >= MAX_IDLE_STREAMS:
            self._end(stream)
            return
        self._idle.append(stream)
        stream.idle_timer = asyncio.get_running_loop().call_later(IDLE_STREAM_S, self._expire, stream)

    def discard_idle(self) -> None:
        """Cancels every idle stream (one turned out dead: the others likely are too)."""
        for stream in self._take_all_idle():
            stream.cancel()

    async def close(self) -> None:
        for stream in self._take_all_idle():
            self._end(stream)
        if self._ending:
            await asyncio.wait(set(self._ending))

    def _take_all_idle(self) -> list[EpisodeStream]:
        idle, self._idle = self._idle, []
        for stream in idle:
            if stream.idle_timer is not None:
                stream.idle_timer.cancel()
        return idle

    def _expire(self, stream: EpisodeStream) -> None:
        if stream in self._idle:
            self._idle.remove(stream)
            self._end(stream)

    def _end(self, stream: EpisodeStream) -> None:
        task = asyncio.get_running_loop().create_task(stream.end(self._end_timeout_s))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)
