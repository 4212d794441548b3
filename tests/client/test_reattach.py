"""The Python client reattaches by task id when a stream breaks mid-call, and keeps sessions alive.

A small grpc.aio proxy sits on loopback between the client and an in-process
server. It forwards every RPC byte for byte and, when told to, breaks a
CallTool stream (or the RunEpisode stream carrying a call_tool step) right
after forwarding the call's task id while the tool is still running: the
client sees the status a server-side break produces. The environment counts its tool runs, so the test can show that the
tool ran exactly once and that the client got that run's result. ScoreGroup streams are forwarded and cut the same way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator, ClassVar, Optional

import grpc
import pytest
from pydantic import BaseModel

from ors_grpc import GroupScore, Message, TextBlock, ToolOutput, tool
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc.client import AsyncORSClient, ORSServerError
from ors_grpc.server import ServerConfig, create_server
from tests.support.environments import EchoEnv

pytestmark = pytest.mark.timeout(60)

CALL_TOOL = "/ors.v1.EnvironmentService/CallTool"
SCORE_GROUP = "/ors.v1.EnvironmentService/ScoreGroup"
RUN_EPISODE = "/ors.v1.EnvironmentService/RunEpisode"
TOOL_SECONDS = 1.0


class CountInput(BaseModel):
    seconds: float


class CountingEnv(EchoEnv):
    """EchoEnv plus a slow tool that counts its runs and finishes."""

    runs: ClassVar[list[int]] = []
    finished: ClassVar[list[int]] = []
    #: How many group scorings ran.
    scorings: ClassVar[list[int]] = []

    @tool
    async def slow_count(self, params: CountInput) -> ToolOutput:
        """Sleep, then answer which run this was."""
        run = len(CountingEnv.runs) + 1
        CountingEnv.runs.append(run)
        await asyncio.sleep(params.seconds)
        CountingEnv.finished.append(run)
        return ToolOutput(blocks=[TextBlock(text=f"run {run}")])

    def score_group(self, candidates: list) -> list[float]:
        """Scores every candidate with the scoring's run number."""
        CountingEnv.scorings.append(len(CountingEnv.scorings) + 1)
        return [float(len(CountingEnv.scorings))] * len(candidates)


@dataclass
class Cut:
    """Break CallTool streams with `code` after their first event (or before
    forwarding anything), or drop the client's connection by restarting the
    proxy's listener on the same port."""

    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    before_first_event: bool = False
    drop_connection: bool = False
    times: int = 1


@dataclass
class BreakingProxy:
    """A byte-forwarding gRPC proxy that can break CallTool streams; records what it saw."""

    upstream: grpc.aio.Channel
    cut: Optional[Cut] = None
    #: Answer RunEpisode UNIMPLEMENTED, as a server from before it would.
    without_run_episode: bool = False
    #: Unary method name -> how many of its next calls to answer UNAVAILABLE.
    unavailable: dict[str, int] = field(default_factory=dict)
    #: How many of the next RunEpisode `create` steps break their stream (UNAVAILABLE).
    break_creates: int = 0
    #: CallTool requests and RunEpisode call_tool steps, in order.
    call_requests: list[pb.CallToolRequest | pb.ToolCallStep] = field(default_factory=list)
    #: ScoreGroup requests, in order (cut as CallTool streams are).
    score_requests: list[pb.ScoreGroupRequest] = field(default_factory=list)
    #: (method name, x-session-id metadata or None) of every forwarded RPC.
    session_metadata: list[tuple[str, Optional[str]]] = field(default_factory=list)
    #: len(CountingEnv.finished) at each cut: 0 proves the tool was still running.
    finished_at_cut: list[int] = field(default_factory=list)
    port: int = 0
    _front: Optional[grpc.aio.Server] = None
    _restarts: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._front = grpc.aio.server()
        self._front.add_generic_rpc_handlers([self.handler()])
        self.port = self._front.add_insecure_port(f"127.0.0.1:{self.port}")
        await self._front.start()

    async def stop(self) -> None:
        await asyncio.gather(*self._restarts)
        await self._front.stop(None)

    async def _restart(self) -> None:
        """Closes every client connection (in-flight calls die), then listens again on the same port."""
        await self._front.stop(None)
        await self.start()

    def handler(self) -> grpc.GenericRpcHandler:
        proxy = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
                sent = dict(details.invocation_metadata or ())
                proxy.session_metadata.append((details.method.rsplit("/", 1)[-1], sent.get("x-session-id")))
                if details.method == CALL_TOOL:
                    return grpc.unary_stream_rpc_method_handler(proxy._forward_call_tool)
                if details.method == SCORE_GROUP:
                    return grpc.unary_stream_rpc_method_handler(proxy._forward_score_group)
                if details.method == RUN_EPISODE:
                    if proxy.without_run_episode:
                        return None  # grpc answers UNIMPLEMENTED
                    return grpc.stream_stream_rpc_method_handler(proxy._forward_run_episode)
                return grpc.unary_unary_rpc_method_handler(proxy._forward_unary(details.method))

        return Handler()

    def _forward_unary(self, method: str):
        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            name = method.rsplit("/", 1)[-1]
            if self.unavailable.get(name):
                self.unavailable[name] -= 1
                await context.abort(grpc.StatusCode.UNAVAILABLE, "proxy: no backend right now")
            try:
                return await self.upstream.unary_unary(method)(request, metadata=_metadata(context))
            except grpc.aio.AioRpcError as error:
                await context.abort(error.code(), error.details() or "", tuple(error.trailing_metadata() or ()))

        return forward

    async def _forward_call_tool(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.call_requests.append(pb.CallToolRequest.FromString(request))
        async for event in self._forward_task_stream(CALL_TOOL, request, context):
            yield event

    async def _forward_score_group(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.score_requests.append(pb.ScoreGroupRequest.FromString(request))
        async for event in self._forward_task_stream(SCORE_GROUP, request, context):
            yield event

    async def _forward_task_stream(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        cut = self._take_cut()
        if cut is not None and cut.before_first_event:
            await context.abort(cut.code, "proxy broke the stream")
        stream = self.upstream.unary_stream(method)(request, metadata=_metadata(context))
        try:
            async for event in stream:
                yield event
                if cut is not None:
                    await self._break(cut, context)
        except grpc.aio.AioRpcError as error:
            await context.abort(error.code(), error.details() or "", tuple(error.trailing_metadata() or ()))
        finally:
            stream.cancel()

    async def _forward_run_episode(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Forwards in lockstep (the client sends a step only once the last one
        was answered); a call_tool step may be cut like a CallTool stream,
        before it is forwarded or once the tool started."""
        upstream = self.upstream.stream_stream(RUN_EPISODE)(metadata=_metadata(context))
        try:
            async for request in requests:
                step = pb.RunEpisodeRequest.FromString(request)
                if step.WhichOneof("step") == "create" and self.break_creates:
                    self.break_creates -= 1
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "proxy broke the stream")
                cut = None
                if step.WhichOneof("step") == "call_tool":
                    self.call_requests.append(step.call_tool)
                    cut = self._take_cut()
                    if cut is not None and cut.before_first_event:
                        await context.abort(cut.code, "proxy broke the stream")
                runs_before = len(CountingEnv.runs)
                await upstream.write(request)
                if cut is not None:
                    await _tool_started(runs_before)
                    await self._break(cut, context)
                yield await upstream.read()
            await upstream.done_writing()
            while (answer := await upstream.read()) is not grpc.aio.EOF:
                yield answer
        except grpc.aio.AioRpcError as error:
            await context.abort(error.code(), error.details() or "", tuple(error.trailing_metadata() or ()))
        finally:
            upstream.cancel()

    async def _break(self, cut: Cut, context: grpc.aio.ServicerContext) -> None:
        self.finished_at_cut.append(len(CountingEnv.finished))
        if cut.drop_connection:
            self._restarts.append(asyncio.create_task(self._restart()))
            await asyncio.Event().wait()  # until the restart cancels this handler
        await context.abort(cut.code, "proxy broke the stream")

    def _take_cut(self) -> Optional[Cut]:
        if self.cut is None or self.cut.times == 0:
            return None
        self.cut.times -= 1
        return self.cut


async def _tool_started(runs_before: int, limit_s: float = 10.0) -> None:
    """Waits until the tool run counter passes `runs_before` (read before the
    step was forwarded: the tool may start before this coroutine resumes)."""
    async with asyncio.timeout(limit_s):
        while len(CountingEnv.runs) == runs_before:
            await asyncio.sleep(0.01)


def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str], ...]:
    """The caller's ORS metadata (x-session-id, x-api-key), without transport headers."""
    return tuple((m.key, m.value) for m in context.invocation_metadata() if m.key.startswith("x-"))


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[BreakingProxy, str]]:
    CountingEnv.runs.clear()
    CountingEnv.finished.clear()
    CountingEnv.scorings.clear()
    server, port = await create_server([CountingEnv], "127.0.0.1:0", config=ServerConfig())
    upstream = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    breaking = BreakingProxy(upstream)
    await breaking.start()
    try:
        yield breaking, breaking.target
    finally:
        await breaking.stop()
        await upstream.close()
        await server.stop(None)


@pytest.mark.parametrize(
    "cut",
    [Cut(grpc.StatusCode.UNAVAILABLE), Cut(grpc.StatusCode.CANCELLED), Cut(drop_connection=True)],
    ids=["unavailable", "cancelled", "connection-dropped"],
)
async def test_a_call_tool_stream_broken_mid_call_is_reattached_and_the_tool_runs_once(proxy, cut) -> None:
    breaking, target = proxy
    breaking.cut = cut
    async with AsyncORSClient(target, stream_episodes=False) as client:
        async with client.environment("countingenv").session(split="train", index=0) as session:
            output = await session.call_tool("slow_count", {"seconds": TOOL_SECONDS})

    assert breaking.finished_at_cut == [0], "the stream must break while the tool runs"
    first, second = breaking.call_requests
    assert first.call.task_id == "" and second.call.task_id != ""
    assert CountingEnv.runs == [1] and CountingEnv.finished == [1]
    assert output.blocks == [TextBlock(text="run 1")]
    # Every session-scoped call carried the session id as metadata too (load-balancer affinity).
    methods = [method for method, _ in breaking.session_metadata]
    assert methods == ["CreateSessionId", "CreateEpisode", "CallTool", "CallTool", "DeleteEpisode", "DeleteSessionId"]
    assert [sid for _, sid in breaking.session_metadata] == [None] + [first.session_id] * 5


@pytest.mark.parametrize(
    "cut",
    [Cut(grpc.StatusCode.UNAVAILABLE), Cut(grpc.StatusCode.CANCELLED), Cut(drop_connection=True)],
    ids=["unavailable", "cancelled", "connection-dropped"],
)
async def test_an_episode_stream_broken_mid_call_is_reattached_by_call_tool_and_the_tool_runs_once(
    proxy, cut
) -> None:
    breaking, target = proxy
    breaking.cut = cut
    async with AsyncORSClient(target) as client:
        async with client.environment("countingenv").session(split="train", index=0) as session:
            sid = session.session_id
            output = await session.call_tool("slow_count", {"seconds": TOOL_SECONDS})
            # The stream is gone; the episode is not: later steps go by RPC.
            assert await session.get_prompt() == [TextBlock(text="Say hello")]
        assert (await client.health()).open_sessions == 0

    assert breaking.finished_at_cut == [0], "the stream must break while the tool runs"
    step, reattach = breaking.call_requests
    assert step.task_id != "" and reattach.call.task_id == step.task_id  # the client chose the id
    assert CountingEnv.runs == [1] and CountingEnv.finished == [1]
    assert output.blocks == [TextBlock(text="run 1")]
    methods = [method for method, _ in breaking.session_metadata]
    assert methods == ["RunEpisode", "CallTool", "GetPrompt", "DeleteEpisode", "DeleteSessionId", "Health"]
    # The client minted the session id, so even the stream carried it as metadata.
    assert [sid_sent for _, sid_sent in breaking.session_metadata] == [sid] * 5 + [None]


async def test_a_stream_broken_before_the_task_id_is_not_retried(proxy) -> None:
    breaking, target = proxy
    breaking.cut = Cut(before_first_event=True)
    async with AsyncORSClient(target, stream_episodes=False) as client:
        async with client.environment("countingenv").session(split="train", index=0) as session:
            with pytest.raises(ORSServerError) as broken:
                await session.call_tool("slow_count", {"seconds": 0})
            # Unknown whether the tool started: the client must not run it again blindly.
            assert len(breaking.call_requests) == 1
            assert broken.value.code == grpc.StatusCode.UNAVAILABLE
            assert (await session.call_tool("slow_count", {"seconds": 0})).blocks == [TextBlock(text="run 1")]


async def test_reattaching_gives_up_after_the_configured_attempts(proxy) -> None:
    breaking, target = proxy
    breaking.cut = Cut(times=10)
    async with AsyncORSClient(target, reattach_attempts=2, stream_episodes=False) as client:
        async with client.environment("countingenv").session(split="train", index=0) as session:
            with pytest.raises(ORSServerError) as broken:
                await session.call_tool("slow_count", {"seconds": 0})
    assert broken.value.code == grpc.StatusCode.UNAVAILABLE
    assert len(breaking.call_requests) == 3
    assert CountingEnv.runs == [1]


async def test_an_episode_stream_broken_before_the_call_reached_the_server_says_the_tool_did_not_run(
    proxy,
) -> None:
    breaking, target = proxy
    breaking.cut = Cut(before_first_event=True)
    async with AsyncORSClient(target) as client:
        async with client.environment("countingenv").session(split="train", index=0) as session:
            with pytest.raises(ORSServerError) as broken:
                await session.call_tool("slow_count", {"seconds": 0})
            assert broken.value.code == grpc.StatusCode.UNAVAILABLE
            assert "the tool did not run" in broken.value.message
            step, attach = breaking.call_requests
            assert attach.call.task_id == step.task_id  # the attach found no such call
            assert CountingEnv.runs == []
            # The next call goes by CallTool, to the same episode.
            assert (await session.call_tool("slow_count", {"seconds": 0})).blocks == [TextBlock(text="run 1")]
        assert (await client.health()).open_sessions == 0
    methods = [method for method, _ in breaking.session_metadata]
    assert methods == ["RunEpisode", "CallTool", "CallTool", "DeleteEpisode", "DeleteSessionId", "Health"]


async def test_a_server_without_run_episode_gets_one_rpc_per_step(proxy) -> None:
    breaking, target = proxy
    breaking.without_run_episode = True
    async with AsyncORSClient(target) as client:
        async with client.environment("countingenv").session(split="train", index=0) as session:
            assert await session.get_prompt() == [TextBlock(text="Say hello")]
            assert (await session.call_tool("slow_count", {"seconds": 0})).blocks == [TextBlock(text="run 1")]
    methods = [method for method, _ in breaking.session_metadata]
    assert methods == [
        "RunEpisode", "CreateSessionId", "CreateEpisode", "GetPrompt", "CallTool", "DeleteEpisode", "DeleteSessionId",
    ]


async def test_idempotent_calls_are_retried_on_unavailable_and_creating_an_episode_is_not(proxy) -> None:
    breaking, target = proxy
    async with AsyncORSClient(target, stream_episodes=False) as client:
        env = client.environment("countingenv")
        breaking.unavailable = {"ListSplits": 2, "GetPrompt": 1, "DeleteEpisode": 1}
        assert [split.name for split in await env.list_splits()] == ["train", "test"]
        async with env.session(split="train", index=0) as session:
            assert await session.get_prompt() == [TextBlock(text="Say hello")]
        assert (await client.health()).open_sessions == 0  # the retried delete went through

        breaking.unavailable = {"CreateEpisode": 1}
        with pytest.raises(ORSServerError) as refused:
            async with env.session(split="train", index=0):
                pass
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    methods = [method for method, _ in breaking.session_metadata]
    assert methods.count("ListSplits") == 3 and methods.count("GetPrompt") == 2
    assert methods.count("DeleteEpisode") == 3  # 2 for the first session, 1 for the refused one
    assert methods.count("CreateEpisode") == 2  # 1 for each session: never retried


async def test_sessions_one_after_another_share_one_stream_and_its_route_key(proxy) -> None:
    breaking, target = proxy
    async with AsyncORSClient(target) as client:
        env = client.environment("countingenv")
        sids = []
        for _ in range(3):
            async with env.session(split="train", index=0) as session:
                sids.append(session.session_id)
                # The stream is busy with the call, so the prompt goes by GetPrompt.
                await asyncio.gather(session.call_tool("slow_count", {"seconds": 0.1}), session.get_prompt())
        assert (await client.health()).open_sessions == 0
    assert len(set(sids)) == 3
    session_calls = [(method, key) for method, key in breaking.session_metadata if method != "Health"]
    assert [method for method, _ in session_calls] == ["RunEpisode", "GetPrompt", "GetPrompt", "GetPrompt"]
    # The stream was routed by the first session's id: every later call of every session says the same.
    assert {key for _, key in session_calls} == {sids[0]}


async def test_an_idle_stream_is_ended_after_a_while(proxy, monkeypatch) -> None:
    monkeypatch.setattr("ors_grpc.client._episode_stream.IDLE_STREAM_S", 0.1)
    breaking, target = proxy
    async with AsyncORSClient(target) as client:
        env = client.environment("countingenv")
        async with env.session(split="train", index=0):
            pass
        await asyncio.sleep(0.5)
        async with env.session(split="train", index=0):
            pass
    methods = [method for method, _ in breaking.session_metadata]
    assert methods == ["RunEpisode", "RunEpisode"]


async def test_a_reused_stream_that_broke_gives_way_to_a_new_one(proxy) -> None:
    breaking, target = proxy
    async with AsyncORSClient(target) as client:
        env = client.environment("countingenv")
        async with env.session(split="train", index=0):
            pass
        breaking.break_creates = 1  # the idle stream dies as the next episode starts on it
        async with env.session(split="train", index=0) as session:
            assert (await session.call_tool("slow_count", {"seconds": 0})).blocks == [TextBlock(text="run 1")]
        assert (await client.health()).open_sessions == 0
    methods = [method for method, _ in breaking.session_metadata]
    # The broken create may have gone through: the client deleted it by RPC (its id was the
    # stream's, never minted by CreateSessionId: nothing to release), then opened a new stream.
    assert methods[:3] == ["RunEpisode", "DeleteEpisode", "RunEpisode"]


async def test_keepalive_pings_keep_an_idle_session_from_being_reaped() -> None:
    config = ServerConfig(session_timeout_s=1.0, reaper_interval_s=0.1)
    server, port = await create_server([EchoEnv], "127.0.0.1:0", config=config)
    target = f"127.0.0.1:{port}"
    try:
        async with AsyncORSClient(target, ping_interval_s=0.2) as pinging, AsyncORSClient(
            target, ping_interval_s=3600
        ) as silent:
            async with pinging.environment("echoenv").session(split="train", index=0) as kept:
                async with silent.environment("echoenv").session(split="train", index=0) as idle:
                    await _wait_until_reaped(target, idle)
                    # Idle for longer than the timeout, too, but pinged all along.
                    assert await kept.get_prompt() == [TextBlock(text="Say hello")]
    finally:
        await server.stop(None)


async def _wait_until_reaped(target: str, session, limit_s: float = 20.0) -> None:
    """Waits (without touching the session, which would refresh it) until the server forgot it."""
    client = AsyncORSClient(target)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while (await client.health()).open_sessions > 1:
            assert loop.time() < deadline, "the unpinged session was never reaped"
            await asyncio.sleep(0.1)
    finally:
        await client.close()
    with pytest.raises(ORSServerError) as gone:
        await session.get_prompt()
    assert gone.value.reason == "ERROR_REASON_SESSION_NOT_FOUND"


async def test_a_stream_broken_before_the_task_id_is_sent_again_with_its_key_once_the_server_honours_keys(
    proxy,
) -> None:
    breaking, target = proxy
    async with AsyncORSClient(target, stream_episodes=False) as client:
        async with client.environment("countingenv").session(split="train", index=0) as session:
            # The first call shows the server runs calls under the client's key.
            assert (await session.call_tool("slow_count", {"seconds": 0})).blocks == [TextBlock(text="run 1")]
            breaking.cut = Cut(before_first_event=True)
            output = await session.call_tool("slow_count", {"seconds": 0})
    first, cut, retried = breaking.call_requests
    assert first.idempotency_key and first.idempotency_key != cut.idempotency_key
    assert retried.idempotency_key == cut.idempotency_key and retried.call.task_id == ""
    assert output.blocks == [TextBlock(text="run 2")]
    assert CountingEnv.runs == [1, 2]
async def test_a_new_stream_that_broke_before_creating_is_retried_on_another_and_gives_up_in_the_end(proxy) -> None:
    breaking, target = proxy
    async with AsyncORSClient(target) as client:
        env = client.environment("countingenv")
        breaking.break_creates = 2  # as a server shedding a burst of new streams would
        async with env.session(split="train", index=0) as session:
            assert (await session.call_tool("slow_count", {"seconds": 0})).blocks == [TextBlock(text="run 1")]
        assert (await client.health()).open_sessions == 0
        methods = [method for method, _ in breaking.session_metadata if method != "Health"]
        # Each broken create may have gone through: deleted by RPC before the next stream.
        assert methods[:7] == ["RunEpisode", "DeleteEpisode", "DeleteSessionId"] * 2 + ["RunEpisode"]

        breaking.break_creates = 100
        with pytest.raises(ORSServerError) as refused:
            async with env.session(split="train", index=0):
                pass
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        assert breaking.break_creates == 100 - 5  # the first try and 4 more
        assert (await client.health()).open_sessions == 0


async def test_a_scoring_broken_before_its_task_id_is_sent_again_with_its_key_once_the_server_honours_scoring_keys(
    proxy,
) -> None:
    breaking, target = proxy
    answer = [Message(role="assistant", blocks=[TextBlock(text="42")])]
    async with AsyncORSClient(target, stream_episodes=False) as client:
        async with client.environment("countingenv").session(split="train", index=0) as session:
            # Keys honoured for tool calls say nothing of scorings: this one is not sent again.
            await session.call_tool("slow_count", {"seconds": 0})
            breaking.cut = Cut(before_first_event=True)
            with pytest.raises(ORSServerError) as broken:
                await session.score_group([answer])
            assert broken.value.code == grpc.StatusCode.UNAVAILABLE
            # This scoring shows that the server runs scorings under the client's key.
            assert await session.score_group([answer]) == [GroupScore(reward=1.0)]
            breaking.cut = Cut(before_first_event=True)
            scores = await session.score_group([answer, answer])
    never_sent, shown, cut, retried = breaking.score_requests
    assert never_sent.idempotency_key and shown.task_id == ""
    assert len({never_sent.idempotency_key, shown.idempotency_key, cut.idempotency_key}) == 3
    assert retried.idempotency_key == cut.idempotency_key and retried.task_id == ""
    assert scores == [GroupScore(reward=2.0)] * 2
    assert CountingEnv.scorings == [1, 2]
