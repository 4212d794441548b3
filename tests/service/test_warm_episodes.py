"""Warm episodes (PrepareEpisodes, HTTP `/{env}/prepare`): prepared ahead, claimed by a later creation.

gRPC through the Python client on a server in the test's process (its
environments' setups and teardowns are numbered in `EVENTS`); HTTP with raw
aiohttp against `ors-grpc serve --http-port` (the events go to a file).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import AsyncIterator, Callable

import aiohttp
import grpc
import pytest
from prometheus_client import REGISTRY

from ors_grpc import TextBlock, ToolOutput, Toolset, tool
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc.client import AsyncORSClient, ORSClient, ORSServerError
from ors_grpc.server import ServerConfig, create_server
from tests.support.grpc_calls import error_reason, expect_error
from tests.support.servers import start_serve
from tests.support.warm_environments import EVENTS, MARKER_DIR_VARIABLE, FailingWarmEnv, WarmEnv, read_events

WAIT_S = 20.0
WARM_ENVIRONMENTS = ("tests.support.warm_environments:WarmEnv", "tests.support.warm_environments:FailingWarmEnv")


async def until(check: Callable[[], bool], what: str) -> None:
    """Poll `check` until it holds; fail naming `what` after WAIT_S."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def setups() -> list[tuple[str, str, int]]:
    return [event for event in EVENTS if event[0] == "setup"]


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@contextlib.asynccontextmanager
async def warm_server(toolsets: tuple[type, ...] = (), **config: object) -> AsyncIterator[str]:
    """A server of the warm environments in this process; its target."""
    EVENTS.clear()
    server, port = await create_server(
        [WarmEnv, FailingWarmEnv], "127.0.0.1:0", config=ServerConfig(**config),  # type: ignore[arg-type]
        toolsets=toolsets,
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def prompt_of(client: AsyncORSClient, task: dict, secrets: dict[str, str] | None = None) -> str:
    """The prompt of a new episode of `task` (it names the setup that built it)."""
    async with client.environment("warmenv").session(task, secrets) as session:
        return (await session.get_prompt())[0].text


# gRPC --------------------------------------------------------------------------


async def test_a_prepared_episode_is_claimed_and_its_setup_ran_once_before_the_create():
    async with warm_server() as target, AsyncORSClient(target) as client:
        env = client.environment("warmenv")
        claimed_before = metric("ors_warm_episodes_ended_total", environment="warmenv", outcome="claimed")
        assert await env.prepare([{"tag": "a", "n": 1}]) == 1
        await until(lambda: setups() == [("setup", "a", 1)], "the prepared setup")
        assert metric("ors_warm_episodes", environment="warmenv") == 1
        # Another key order is the same canonical task.
        assert await prompt_of(client, {"n": 1, "tag": "a"}) == "setup 1 of a"
        assert setups() == [("setup", "a", 1)]
        assert metric("ors_warm_episodes", environment="warmenv") == 0
        assert metric("ors_warm_episodes_ended_total", environment="warmenv", outcome="claimed") == claimed_before + 1
        # Claimed once only: the next episode of the task is set up anew.
        assert await prompt_of(client, {"tag": "a", "n": 1}) == "setup 2 of a"


async def test_an_episode_still_setting_up_is_claimed_and_waited_for():
    async with warm_server() as target, AsyncORSClient(target) as client:
        env = client.environment("warmenv")
        await env.prepare([{"tag": "slow", "setup_s": 1.0}])
        assert setups() == []
        assert await prompt_of(client, {"tag": "slow", "setup_s": 1.0}) == "setup 1 of slow"
        assert setups() == [("setup", "slow", 1)]


async def test_the_sync_client_prepares_by_split_and_indices():
    async with warm_server() as target:
        with ORSClient(target) as client:
            env = client.environment("warmenv")
            assert await asyncio.to_thread(env.prepare, split="train", indices=[1, 1]) == 2
            await until(lambda: len(setups()) == 2, "two prepared setups")

            def claim_twice() -> list[str]:
                prompts = []
                for _ in range(2):
                    with env.session(split="train", index=1) as session:
                        prompts.append(session.get_prompt()[0].text)
                return prompts

            assert sorted(await asyncio.to_thread(claim_twice)) == ["setup 1 of indexed-1", "setup 2 of indexed-1"]
        assert len(setups()) == 2


async def test_another_task_other_secrets_or_another_api_key_do_not_claim():
    async with warm_server() as target, AsyncORSClient(target, api_key="key-one") as client:
        await client.environment("warmenv").prepare([{"tag": "a"}], secrets={"TOKEN": "one"})
        await until(lambda: len(setups()) == 1, "the prepared setup")
        assert await prompt_of(client, {"tag": "a"}, {"TOKEN": "two"}) == "setup 2 of a"
        assert await prompt_of(client, {"tag": "a"}) == "setup 3 of a"
        assert await prompt_of(client, {"tag": "b"}, {"TOKEN": "one"}) == "setup 4 of b"
        async with AsyncORSClient(target, api_key="key-two") as other_key:
            assert await prompt_of(other_key, {"tag": "a"}, {"TOKEN": "one"}) == "setup 5 of a"
        assert await prompt_of(client, {"tag": "a"}, {"TOKEN": "one"}) == "setup 1 of a"


class ExtraTools(Toolset):
    """A session toolset: an episode created with it is shaped differently from a prepared one."""

    @tool
    def extra(self) -> ToolOutput:
        """A tool only sessions with this toolset have."""
        return ToolOutput(blocks=[TextBlock(text="extra")])


async def test_a_creation_with_a_toolset_does_not_claim_a_prepared_episode():
    async with warm_server(toolsets=(ExtraTools,)) as target, AsyncORSClient(target) as client:
        env = client.environment("warmenv")
        await env.prepare([{"tag": "a"}])
        await until(lambda: len(setups()) == 1, "the prepared setup")
        async with env.session({"tag": "a"}, toolset="ExtraTools") as session:
            assert (await session.get_prompt())[0].text == "setup 2 of a"
            assert "extra" in [spec.name for spec in await session.list_tools()]
        # Still held for a creation without the toolset.
        assert await prompt_of(client, {"tag": "a"}) == "setup 1 of a"


async def test_an_unclaimed_episode_is_torn_down_after_the_ttl():
    async with warm_server(warm_ttl_s=0.3) as target, AsyncORSClient(target) as client:
        expired_before = metric("ors_warm_episodes_ended_total", environment="warmenv", outcome="expired")
        await client.environment("warmenv").prepare([{"tag": "a"}])
        await until(lambda: ("teardown", "a", 1) in EVENTS, "the teardown of the expired episode")
        assert metric("ors_warm_episodes_ended_total", environment="warmenv", outcome="expired") == expired_before + 1
        assert await prompt_of(client, {"tag": "a"}) == "setup 2 of a"


async def test_stopping_the_server_tears_down_the_prepared_episodes():
    async with warm_server() as target, AsyncORSClient(target) as client:
        await client.environment("warmenv").prepare([{"tag": "a"}, {"tag": "b"}])
        await until(lambda: len(setups()) == 2, "the prepared setups")
    assert sorted(event[:2] for event in EVENTS if event[0] == "teardown") == [("teardown", "a"), ("teardown", "b")]


async def test_prepared_episodes_count_toward_max_sessions():
    async with warm_server(max_sessions=2) as target, AsyncORSClient(target) as client:
        env = client.environment("warmenv")
        assert await env.prepare([{"tag": "a"}, {"tag": "b"}]) == 2
        with pytest.raises(ORSServerError) as refused:
            await env.prepare([{"tag": "c"}])
        assert refused.value.reason == "ERROR_REASON_TOO_MANY_SESSIONS"
        with pytest.raises(ORSServerError) as full:
            await prompt_of(client, {"tag": "c"})
        assert full.value.reason == "ERROR_REASON_TOO_MANY_SESSIONS"
        # Claiming one is no new session: it fits.
        async with env.session({"tag": "a"}) as session:
            assert (await session.get_prompt())[0].text.endswith("of a")
            assert (await client.health()).open_sessions == 1
        await until(lambda: len(setups()) == 2, "the prepared setups")
        assert sorted(tag for _, tag, _ in setups()) == ["a", "b"]


async def test_a_prepared_setup_that_failed_surfaces_on_claim_as_a_normal_one_does():
    def failed_setups() -> float:
        return metric("ors_setup_duration_seconds_count", environment="failingwarmenv", outcome="failed")

    async with warm_server() as target, AsyncORSClient(target) as client:
        env = client.environment("failingwarmenv")
        before = failed_setups()
        await env.prepare([{"tag": "f"}])
        await until(lambda: failed_setups() == before + 1, "the prepared setup to fail")
        errors = []
        for _ in range(2):  # the claim, then a fresh episode
            with pytest.raises(ORSServerError) as failed:
                async with env.session({"tag": "f"}) as session:
                    await session.get_prompt()
            errors.append((failed.value.code, failed.value.reason, failed.value.message))
        assert errors[0] == errors[1] == (
            grpc.StatusCode.FAILED_PRECONDITION, "ERROR_REASON_SETUP_FAILED", "RuntimeError: setup of f exploded"
        )
        assert failed_setups() == before + 2


async def test_prepare_requests_must_name_their_tasks_one_way():
    async with warm_server() as target, grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        both = pb.PrepareEpisodesRequest(env_name="warmenv", split="train", indices=[0])
        both.task_specs.add().json = "{}"
        for request in (pb.PrepareEpisodesRequest(env_name="warmenv"), both,
                        pb.PrepareEpisodesRequest(env_name="warmenv", split="train")):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.PrepareEpisodes(request)
            assert error_reason(refused.value) == "ERROR_REASON_INVALID_REQUEST"
        with pytest.raises(grpc.aio.AioRpcError) as bad_index:
            await stub.PrepareEpisodes(pb.PrepareEpisodesRequest(env_name="warmenv", split="train", indices=[99]))
        assert error_reason(bad_index.value) == "ERROR_REASON_INVALID_INDEX"
        answer = await stub.PrepareEpisodes(pb.PrepareEpisodesRequest(split="train", indices=[0]))
        assert (answer.preparing, answer.ttl_seconds) == (1, 300.0)


# HTTP ----------------------------------------------------------------------------


def secrets_header(secrets: dict[str, str]) -> str:
    return base64.b64encode(json.dumps(secrets).encode()).decode()


async def http_prompt(http: aiohttp.ClientSession, body: dict, **headers: str) -> tuple[int, str]:
    """Create an episode (`/create` body) and read its prompt: the prompt's status and text."""
    async with http.post("/create_session") as response:
        sid = (await response.json())["sid"]
    async with http.post("/create", json=body, headers={"X-Session-ID": sid, **headers}) as response:
        assert response.status == 200, await response.text()
    async with http.get(f"/{body['env_name']}/prompt", headers={"X-Session-ID": sid}) as response:
        answer = await response.json()
        status = response.status
    async with http.post("/delete", headers={"X-Session-ID": sid}) as response:
        assert response.status == 200
    return status, answer[0]["text"] if status == 200 else answer["detail"]


async def until_events(folder: Path, check: Callable[[list], bool], what: str) -> list:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not check(events := read_events(folder)):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}: {events}"
        await asyncio.sleep(0.05)
    return events


async def test_http_prepare_is_claimed_by_create_with_the_same_task_and_secrets(tmp_path: Path):
    marker = {MARKER_DIR_VARIABLE: str(tmp_path)}
    with start_serve(*WARM_ENVIRONMENTS, "--http-port", "0", env=marker) as serve:
        async with aiohttp.ClientSession(serve.http_url) as http:
            body = {"split": "train", "indices": [2], "secrets": {"TOKEN": "one"}}
            async with http.post("/warmenv/prepare", json=body) as response:
                assert response.status == 200, await response.text()
                assert await response.json() == {"preparing": 1, "ttl_seconds": 300.0}
            await until_events(tmp_path, lambda events: len(events) == 1, "the prepared setup")
            task = {"env_name": "warmenv", "split": "train", "index": 2}
            # Other secrets (here by the X-Secrets header) do not claim it.
            assert await http_prompt(http, task, **{"X-Secrets": secrets_header({"TOKEN": "two"})}) == (
                200, "setup 2 of indexed-2")
            # Another task with the same secrets does not claim it either.
            other_task = {"env_name": "warmenv", "split": "train", "index": 3, "secrets": {"TOKEN": "one"}}
            assert await http_prompt(http, other_task) == (200, "setup 3 of indexed-3")
            # The same secrets by header claim it, and the same task spec as the index names.
            same = {"env_name": "warmenv", "task_spec": {"tag": "indexed-2"}}
            assert await http_prompt(http, same, **{"X-Secrets": secrets_header({"TOKEN": "one"})}) == (
                200, "setup 1 of indexed-2")
            assert [e for e in read_events(tmp_path) if e[0] == "setup"] == [
                ("setup", "indexed-2", 1), ("setup", "indexed-2", 2), ("setup", "indexed-3", 3)]


async def test_http_ttl_max_sessions_and_failed_setup(tmp_path: Path):
    marker = {MARKER_DIR_VARIABLE: str(tmp_path)}
    with start_serve(*WARM_ENVIRONMENTS, "--http-port", "0", "--warm-ttl", "0.5", "--max-sessions", "2",
                     env=marker) as serve:
        async with aiohttp.ClientSession(serve.http_url) as http:
            prepare = {"task_specs": [{"tag": "t"}, {"tag": "u"}]}
            async with http.post("/warmenv/prepare", json=prepare) as response:
                assert response.status == 200, await response.text()
            async with http.post("/warmenv/prepare", json={"task_specs": [{"tag": "v"}]}) as response:
                assert response.status == 429
                assert response.headers["Retry-After"] == "1"
            # Unclaimed within the TTL: torn down, which frees their places.
            await until_events(
                tmp_path, lambda events: sorted(e[:2] for e in events if e[0] == "teardown") == [
                    ("teardown", "t"), ("teardown", "u")], "the expired episodes' teardowns")
            async with http.post("/failingwarmenv/prepare", json={"task_specs": [{"tag": "f"}]}) as response:
                assert response.status == 200, await response.text()
            failing = {"env_name": "failingwarmenv", "task_spec": {"tag": "f"}}
            assert await http_prompt(http, failing) == (500, "RuntimeError: setup of f exploded")
            assert await http_prompt(http, failing) == (500, "RuntimeError: setup of f exploded")
            async with http.post("/warmenv/prepare", json={"split": "train"}) as response:
                assert response.status == 422
                assert "task_specs" in (await response.json())["detail"]


def test_the_prepare_example_of_the_client_docs_runs():
    """docs/clients.md's `prepare` example (a `py` fence, apart from the numbered Python examples)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "clients.md").read_text()
    code = next(block for block in doc.split("```py\n")[1:] if "env.prepare(" in block).split("```")[0]
    with start_serve("--http-port", "0") as serve:
        done = subprocess.run([sys.executable, "-c", code.replace("127.0.0.1:50051", serve.grpc_target)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["preparing", "2", "1.0"]


# Reserved session ids --------------------------------------------------------


async def test_an_episode_reserved_for_a_session_id_is_claimed_only_under_that_id():
    async with warm_server() as target, AsyncORSClient(target) as client:
        env = client.environment("warmenv")
        task = {"tag": "reserved"}
        assert await env.prepare([task, task], session_ids=["first", "second"]) == 2
        await until(lambda: len(setups()) == 2, "the two reserved setups")
        # A creation by task alone under another id claims neither.
        assert await prompt_of(client, task) == "setup 3 of reserved"
        prompts = {}
        for sid in ("second", "first"):
            async with env.session(task, session_id=sid) as session:
                assert session.session_id == sid
                prompts[sid] = (await session.get_prompt())[0].text
        assert sorted(prompts.values()) == ["setup 1 of reserved", "setup 2 of reserved"]
        assert len(setups()) == 3
    # The sync client, by RPCs (no episode stream), claims the same way.
    async with warm_server() as target:
        with ORSClient(target, stream_episodes=False) as blocking:
            sync_env = blocking.environment("warmenv")
            await asyncio.to_thread(sync_env.prepare, [task], session_ids=["blocking"])
            await until(lambda: len(setups()) == 1, "the reserved setup")

            def claim() -> str:
                with sync_env.session(task, session_id="blocking") as session:
                    return session.get_prompt()[0].text

            assert await asyncio.to_thread(claim) == "setup 1 of reserved"


async def test_a_reserved_episode_needs_its_key_and_task_and_a_routed_prepare_reserves_its_own_id():
    async with warm_server() as target, AsyncORSClient(target) as client:
        env = client.environment("warmenv")
        await env.prepare([{"tag": "keyed"}], {"token": "s"}, session_ids=["mine"])
        await until(lambda: len(setups()) == 1, "the reserved setup")
        async with env.session({"tag": "keyed"}, {"token": "other"}, session_id="mine") as session:
            assert (await session.get_prompt())[0].text == "setup 2 of keyed"  # other secrets: not claimed
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.EnvironmentServiceStub(channel)
            one = pb.PrepareEpisodesRequest(env_name="warmenv", split="train", indices=[0], session_ids=["a"])
            routed_elsewhere = await expect_error(stub.PrepareEpisodes(one, metadata=(("x-session-id", "b"),)))
            assert error_reason(routed_elsewhere) == "ERROR_REASON_SESSION_ID_MISMATCH"
            two = pb.PrepareEpisodesRequest(env_name="warmenv", split="train", indices=[0, 1], session_ids=["a"])
            assert error_reason(await expect_error(stub.PrepareEpisodes(two))) == "ERROR_REASON_INVALID_REQUEST"
            await stub.PrepareEpisodes(one, metadata=(("x-session-id", "a"),))
            taken = await expect_error(stub.PrepareEpisodes(one))
            assert error_reason(taken) == "ERROR_REASON_SESSION_EXISTS"


async def test_an_http_prepare_with_x_session_id_reserves_its_episode_for_that_create(tmp_path: Path):
    env = {MARKER_DIR_VARIABLE: str(tmp_path)}
    with start_serve(*WARM_ENVIRONMENTS, "--http-port", "0", env=env) as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http:
            headers = {"X-Session-ID": "http-reserved"}
            async with http.post("/warmenv/prepare", json={"task_specs": [{"tag": "h"}]}, headers=headers) as response:
                assert response.status == 200
                assert (await response.json())["preparing"] == 1
            async with http.post("/create", json={"task_spec": {"tag": "h"}}, headers=headers) as response:
                assert response.status == 200
            async with http.get("/warmenv/prompt", headers=headers) as response:
                assert (await response.json())[0]["text"] == "setup 1 of h"
    assert [kind for kind, tag, _ in read_events(tmp_path)] == ["setup", "teardown"]
