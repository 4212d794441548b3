"""One environment in the openreward dialect under the openreward server and under ours.

`tests/support/openreward_dialect.py` is served by `openreward.environments.Server`
(after its one import line is switched to `from openreward.environments
import ...`) and by `ors-grpc serve --http-port` as is. Both are driven the
same way, and their answers compared:

- raw HTTP, step by step (`SCENARIO`): every status, JSON body (as exact
  text: key order, int vs float) and SSE event sequence must be identical,
  after dropping random task ids, except the steps in `EXCEPTIONS`, each with
  its reason and the check that replaces equality;
- the unmodified `openreward` client (`client_episodes`): messages in both
  formats, the terminal tool, refusals' `reason`, group scoring, a session
  toolset, riding out a slow setup;
- the concurrency rules (`concurrency_logs`): which calls overlap, read from
  the environment's log file, never from clocks (see `hold_until`).

Both servers bound the wait for `setup()` to 1 s (openreward's is 25 s), so
that the 503 `Environment still starting.` shows up quickly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import aiohttp
import pytest
from openreward.api.environments.client import AsyncEnvironmentsAPI, AsyncSession
from openreward.api.errors import ScoreGroupFailed, ScoreGroupUnsupported, ToolCallError
from openreward.api.environments.types import GroupCandidate, Message, ReasoningBlock, TextBlock, ToolCallBlock

from tests.support.openreward_dialect import PIXEL, TASKS
from tests.support.servers import SERVE_APP_ON_A_FREE_PORT, start_bridge, start_script_server, start_serve
from tests.support.bridge_http import parse_sse
from tests.support.differential import (
    FIELDS_REASON, SPECIFICS_REASON, SSE, Check, Step, adds_specifics, assert_exceptions_name_real_steps,
    assert_same_answer, canonical, lists_the_wrong_fields, observe_sse,
)

pytestmark = pytest.mark.timeout(240)

ENVIRONMENTS = ["ConvoEnv", "PlainEnv", "SlowStartEnv", "StrictEnv"]
TOOLSET = "ScratchpadToolset"
SETUP_WAIT_S = 1

# Runs the openreward server on a free loopback port and announces it like `ors-grpc serve`.
# Its toolsets are its built-in ones: ours joins them, as `--toolset` registers it with ours.
REFERENCE_SERVER = f"""
import os, socket, sys, types
from pathlib import Path
import uvicorn
source = Path("tests/support/openreward_dialect.py").read_text().replace(
    "from ors_grpc import", "from openreward.environments import"
)
module = types.ModuleType("openreward_dialect_reference")
sys.modules[module.__name__] = module
exec(compile(source, "tests/support/openreward_dialect.py", "exec"), module.__dict__)
import openreward.toolsets
import openreward.environments.server as server_module
openreward.toolsets.BUILTIN_TOOLSETS[module.{TOOLSET}.name()] = module.{TOOLSET}
server_module._SETUP_WAIT_TIMEOUT_S = {SETUP_WAIT_S}
server = server_module.Server([{", ".join(f"module.{name}" for name in ENVIRONMENTS)}])
""" + SERVE_APP_ON_A_FREE_PORT


@pytest.fixture(scope="module")
def reference_url() -> Iterator[str]:
    with start_script_server(REFERENCE_SERVER, name="openreward server") as url:
        yield url


SERVE_ARGS = (
    *(f"tests.support.openreward_dialect:{name}" for name in ENVIRONMENTS),
    "--toolset", f"tests.support.openreward_dialect:{TOOLSET}",
    "--setup-wait", str(SETUP_WAIT_S),
)


@pytest.fixture(scope="module")
def ours_url() -> Iterator[str]:
    with start_serve(*SERVE_ARGS, "--http-port", "0") as serve:
        yield serve.http_url


# ----------------------------------------------------------------------------
# Raw HTTP, step by step
# ----------------------------------------------------------------------------


def candidate(*texts: str, metadata: Any = None, reasoning: str | None = None) -> dict:
    blocks = [{"type": "reasoning", "text": reasoning, "signature": None}] if reasoning else []
    blocks += [{"type": "text", "text": text} for text in texts]
    return {"messages": [{"role": "user", "blocks": [{"type": "text", "text": "Q?"}]},
                         {"role": "assistant", "blocks": blocks}], "metadata": metadata}


def call(name: str, **tool_input: Any) -> dict:
    return {"name": name, "input": tool_input}


CONVO, PLAIN, SLOW, STRICT = "/convoenv", "/plainenv", "/slowstartenv", "/strictenv"

SCENARIO = [
    # Discovery: the new fields of the tool listing
    Step("tools", "GET", f"{CONVO}/tools"),
    Step("tools without terminal or scoring", "GET", f"{PLAIN}/tools"),
    Step("tools bare path", "GET", "/tools"),
    Step("tools of an unknown environment", "GET", "/nosuchenv/tools"),
    # An episode of the conversation environment
    Step("create", "POST", "/create", {"env_name": "convoenv", "split": "train", "index": 0}, sid="c-1"),
    Step("messages", "GET", f"{CONVO}/messages", sid="c-1"),
    Step("messages other env path", "GET", f"{PLAIN}/messages", sid="c-1"),
    Step("messages without id", "GET", f"{CONVO}/messages"),
    Step("messages unknown session", "GET", f"{CONVO}/messages", sid="nobody"),
    Step("prompt", "GET", f"{CONVO}/prompt", sid="c-1"),
    Step("task_tools", "GET", f"{CONVO}/task_tools", sid="c-1"),
    Step("call note", "POST", f"{CONVO}/call", call("note", text="first"), sid="c-1", headers=SSE),
    Step("call task tool", "POST", f"{CONVO}/call", call("hint"), sid="c-1"),
    Step("call unknown tool", "POST", f"{CONVO}/call", call("nope"), sid="c-1"),
    Step("call bad input", "POST", f"{CONVO}/call", call("note", words=1), sid="c-1"),
    Step("score_group", "POST", f"{CONVO}/score_group",
         {"candidates": [candidate("It is 42", metadata={"i": 0}, reasoning="6*7"), candidate("no idea")]},
         sid="c-1", headers=SSE),
    Step("score_group rich blocks", "POST", f"{CONVO}/score_group", {"candidates": [{"messages": [
        {"role": "assistant", "blocks": [
            {"type": "tool_call", "id": "t1", "name": "note", "input": {"text": "x", "n": 2**60}},
        ]},
        {"role": "user", "blocks": [{"type": "tool_result", "tool_call_id": "t1", "is_error": True,
                                     "blocks": [{"type": "text", "text": "failed", "detail": {"k": 1.0}},
                                                {"type": "image", "data": PIXEL, "mimeType": "image/png"}]}]},
        {"role": "assistant", "blocks": [{"type": "text", "text": "42!"}], "detail": {"final": True}},
    ], "metadata": None}]}, sid="c-1"),
    Step("score_group environment raised", "POST", f"{CONVO}/score_group", {"candidates": []}, sid="c-1"),
    Step("score_group wrong count", "POST", f"{CONVO}/score_group",
         {"candidates": [candidate("42", metadata={"miscount": True}), candidate("41")]}, sid="c-1"),
    Step("score_group unknown task_id", "POST", f"{CONVO}/score_group",
         {"candidates": [], "task_id": "0" * 32}, sid="c-1"),
    Step("score_group misplaced block", "POST", f"{CONVO}/score_group",
         {"candidates": [{"messages": [{"role": "system", "blocks": [{"type": "reasoning", "text": "x"}]}]}]},
         sid="c-1"),
    Step("score_group bad body", "POST", f"{CONVO}/score_group", {"candidate": []}, sid="c-1"),
    Step("score_group without id", "POST", f"{CONVO}/score_group", {"candidates": []}),
    Step("score_group unknown session", "POST", f"{CONVO}/score_group", {"candidates": []}, sid="nobody"),
    Step("call terminal tool", "POST", f"{CONVO}/call", call("answer", answer="42"), sid="c-1"),
    Step("call after finished", "POST", f"{CONVO}/call", call("note", text="late"), sid="c-1"),
    Step("call terminal tool after finished", "POST", f"{CONVO}/call", call("answer", answer="42"), sid="c-1"),
    Step("score_group after finished", "POST", f"{CONVO}/score_group", {"candidates": [candidate("42")]},
         sid="c-1"),
    Step("delete", "POST", "/delete", sid="c-1"),
    Step("messages after delete", "GET", f"{CONVO}/messages", sid="c-1"),
    Step("score_group after delete", "POST", f"{CONVO}/score_group", {"candidates": []}, sid="c-1"),
    # A prompt-based environment: default messages, no group scoring
    Step("create plain", "POST", "/create", {"env_name": "plainenv", "split": "train", "index": 1}, sid="p-1"),
    Step("messages by default", "GET", f"{PLAIN}/messages", sid="p-1"),
    Step("task_tools plain", "GET", f"{PLAIN}/task_tools", sid="p-1"),
    Step("score_group unsupported", "POST", f"{PLAIN}/score_group", {"candidates": [candidate("x")]}, sid="p-1"),
    Step("call plain refused reason", "POST", f"{PLAIN}/call", call("nope"), sid="p-1"),
    Step("delete plain", "POST", "/delete", sid="p-1"),
    # A session toolset
    Step("create unknown toolset", "POST", "/create",
         {"env_name": "convoenv", "split": "train", "index": 0, "toolset_name": "nope"}, sid="t-0"),
    Step("ping after unknown toolset", "POST", "/ping", sid="t-0"),
    Step("create with an empty toolset name", "POST", "/create",
         {"env_name": "convoenv", "split": "train", "index": 0, "toolset_name": ""}, sid="t-00"),
    Step("create with toolset", "POST", "/create",
         {"env_name": "convoenv", "split": "train", "index": 1, "toolset_name": "scratchpad"}, sid="t-1"),
    Step("task_tools with toolset", "GET", f"{CONVO}/task_tools", sid="t-1"),
    Step("call toolset tool replacing the environment's", "POST", f"{CONVO}/call", call("note", text="n"),
         sid="t-1"),
    Step("call toolset tool", "POST", f"{CONVO}/call", call("erase"), sid="t-1"),
    Step("call toolset terminal tool", "POST", f"{CONVO}/call", call("final", answer="Paris"), sid="t-1"),
    Step("call environment terminal tool after finished", "POST", f"{CONVO}/call", call("answer", answer="x"),
         sid="t-1"),
    Step("delete toolset session", "POST", "/delete", sid="t-1"),
    Step("create with a toolset that refuses the environment", "POST", "/create",
         {"env_name": "convoenv", "task_spec": {**TASKS[0], "refuse_scratchpad": "no pad for this task"},
          "toolset_name": "scratchpad"}, sid="t-2"),
    Step("ping after a refusing toolset", "POST", "/ping", sid="t-2"),
    Step("create with a toolset that breaks", "POST", "/create",
         {"env_name": "convoenv", "task_spec": {**TASKS[0], "break_scratchpad": "pad torn"},
          "toolset_name": "scratchpad"}, sid="t-3"),
    Step("prompt after a breaking toolset", "GET", f"{CONVO}/prompt", sid="t-3"),
    # A constructor that rejects the task spec fails the creation; no session is left
    Step("create rejected by the constructor", "POST", "/create",
         {"env_name": "strictenv", "task_spec": {"id": 1}}, sid="v-1"),
    Step("ping after a rejected task spec", "POST", "/ping", sid="v-1"),
    Step("prompt after a rejected task spec", "GET", f"{STRICT}/prompt", sid="v-1"),
    Step("call after a rejected task spec", "POST", f"{STRICT}/call", call("open_locker"), sid="v-1"),
    Step("delete after a rejected task spec", "POST", "/delete", sid="v-1"),
    Step("create again under the rejected id", "POST", "/create",
         {"env_name": "strictenv", "split": "train", "index": 0}, sid="v-1"),
    Step("call on the created episode", "POST", f"{STRICT}/call", call("open_locker"), sid="v-1"),
    Step("delete the created episode", "POST", "/delete", sid="v-1"),
    # A setup() that raises: the error keeps its type
    Step("create jammed", "POST", "/create",
         {"env_name": "strictenv", "task_spec": {"question": "Open?", "answer": "no", "jam": True}}, sid="j-1"),
    Step("call after a failed setup", "POST", f"{STRICT}/call", call("open_locker"), sid="j-1"),
    Step("call after a failed setup, streamed", "POST", f"{STRICT}/call", call("open_locker"), sid="j-1",
         headers=SSE),
    Step("delete jammed", "POST", "/delete", sid="j-1"),
    # A setup slower than the servers' bound on waiting for it
    Step("create slow", "POST", "/create",
         {"env_name": "slowstartenv", "task_spec": {"question": "Ready?", "setup_s": 12}}, sid="s-1"),
    Step("prompt while starting", "GET", f"{SLOW}/prompt", sid="s-1"),
    Step("messages while starting", "GET", f"{SLOW}/messages", sid="s-1"),
    Step("call while starting", "POST", f"{SLOW}/call", call("ping_tool"), sid="s-1"),
    Step("score_group while starting", "POST", f"{SLOW}/score_group", {"candidates": []}, sid="s-1"),
    Step("task_tools while starting", "GET", f"{SLOW}/task_tools", sid="s-1"),
    Step("ping while starting", "POST", "/ping", sid="s-1"),
    Step("delete slow", "POST", "/delete", sid="s-1"),
]


# ----------------------------------------------------------------------------
# Exceptions: where ours differs from the openreward server on purpose
# ----------------------------------------------------------------------------


def same_status_string_detail(reference: dict, ours: dict) -> bool:
    """openreward's 422s carry pydantic's error list; ours a string that names the field."""
    return reference["status"] == ours["status"] == 422 and isinstance(ours["body"]["detail"], str)


def names_valid_toolsets(reference: dict, ours: dict, name: str = "nope") -> bool:
    detail = ours["body"]["detail"]
    return (
        reference["status"] == ours["status"] == 400
        and reference["body"]["detail"].startswith(f"unknown toolset {name!r}; valid options are [")
        and detail == f"unknown toolset {name!r}; valid options are ['scratchpad']"
    )


#: The answer to a session call that waited out the bound on setup().
STARTING = {"status": 503, "X-Backend-State": "starting", "Retry-After": "2",
            "body": {"detail": "Environment still starting."}, "text": '{"detail":"Environment still starting."}'}

EXCEPTIONS: dict[str, tuple[str, Check]] = {
    "score_group misplaced block": (
        "422 detail: a string naming the field vs pydantic's list",
        lambda ref, ours: same_status_string_detail(ref, ours) and "'reasoning' block" in ours["body"]["detail"],
    ),
    "score_group bad body": ("422 detail: a string naming the field vs pydantic's list", same_status_string_detail),
    "task_tools while starting": (
        "ours waits for setup() here as for every session call (ORS.md section 2, ors-sdk); openreward "
        "0.1.167 lists the tools of the constructed environment at once",
        lambda ref, ours: ref["status"] == 200 and ours == STARTING,
    ),
    "tools of an unknown environment": (
        "ours answers 404 naming the hosted environments; openreward redirects to the first one "
        "(/convoenv/nosuchenv/tools), where the client then gets a bare 404",
        lambda ref, ours: ref == {"status": 308, "location": "/convoenv/nosuchenv/tools"}
        and ours["status"] == 404
        and ours["body"] == {"detail": "unknown environment 'nosuchenv'; this server hosts: "
                                       "convoenv, plainenv, slowstartenv, strictenv"},
    ),
    "create unknown toolset": (
        "the valid toolsets are those registered with the server (openreward lists its built-in ones, "
        "which need its platform)",
        names_valid_toolsets,
    ),
    "call bad input": (FIELDS_REASON, lists_the_wrong_fields("text: Field required")),
    **{name: (SPECIFICS_REASON, adds_specifics) for name in (
        "messages unknown session", "score_group unknown session", "messages after delete", "score_group after delete",
        "ping after unknown toolset", "ping after a refusing toolset", "prompt after a breaking toolset",
        "ping after a rejected task spec", "prompt after a rejected task spec", "call after a rejected task spec",
    )},
    "create with an empty toolset name": (
        "an empty toolset_name is a name, unknown as under openreward (not 'no toolset'); the valid ones "
        "are ours",
        lambda ref, ours: names_valid_toolsets(ref, ours, ""),
    ),
}


# ----------------------------------------------------------------------------
# Running the scenario
# ----------------------------------------------------------------------------

#: Response headers that are part of the answer (the 503's).
ANSWER_HEADERS = ("X-Backend-State", "Retry-After")


async def observe(http: aiohttp.ClientSession, step: Step) -> dict:
    headers = dict(step.headers)
    if step.sid is not None:
        headers["X-Session-ID"] = step.sid
    async with http.request(step.method, step.path, json=step.body, headers=headers, allow_redirects=False) as response:
        text = await response.text()
        observation: dict[str, Any] = {"status": response.status}
        observation.update({name: response.headers[name] for name in ANSWER_HEADERS if name in response.headers})
        if response.status == 308:
            observation["location"] = response.headers["Location"]
        elif response.headers.get("Content-Type", "").startswith("text/event-stream"):
            observation["body"] = observe_sse(text)
        else:
            observation["body"] = json.loads(text)
            observation["text"] = text  # the exact JSON text: key order and number forms
        return observation


async def run_scenario(base_url: str) -> dict[str, dict]:
    async with aiohttp.ClientSession(base_url=base_url) as http:
        return {step.name: await observe(http, step) for step in SCENARIO}


@pytest.fixture(scope="module")
def observations(reference_url: str, ours_url: str) -> tuple[dict, dict]:
    return asyncio.run(run_scenario(reference_url)), asyncio.run(run_scenario(ours_url))


def test_exceptions_name_real_steps() -> None:
    assert_exceptions_name_real_steps(SCENARIO, EXCEPTIONS)


@pytest.mark.parametrize("step", SCENARIO, ids=[step.name for step in SCENARIO])
def test_same_as_openreward(observations: tuple[dict, dict], step: Step) -> None:
    assert_same_answer(observations, step, EXCEPTIONS, "openreward")


def test_bridge_alone_answers_as_serve(observations: tuple[dict, dict]) -> None:
    """`ors-grpc bridge` in front of a gRPC-only backend (a network channel,
    not the in-process one) gives the same answers as `serve --http-port`."""
    with start_serve(*SERVE_ARGS) as backend, start_bridge(backend.grpc_target) as bridge:
        alone = asyncio.run(run_scenario(bridge.http_url))
    assert canonical(alone) == canonical(observations[1])


def test_scenario_exercises_the_surface(observations: tuple[dict, dict]) -> None:
    """What the openreward server answered is what the steps claim to test
    (so that an equal answer from ours means something)."""
    reference = observations[0]
    assert reference["tools"]["body"]["terminal_tool"] == {
        "name": "answer", "arg": "answer", "description": "Submit the final answer."}
    assert [m["role"] for m in reference["messages"]["body"]] == ["system", "user", "assistant", "user"]
    assert reference["score_group"]["body"]["result"]["scores"][1] == {"reward": 0.25, "metadata": None}
    assert reference["score_group environment raised"]["body"]["errors"] == ["no candidates to score"]
    assert reference["call after finished"]["body"]["result"]["reason"] == "episode_finished"
    assert reference["score_group unsupported"]["status"] == 404
    assert reference["prompt while starting"] == STARTING
    assert reference["call toolset terminal tool"]["body"]["result"]["output"]["reward"] == 0.5
    assert reference["create with a toolset that refuses the environment"]["status"] == 400
    assert reference["create with a toolset that breaks"]["body"] == {"detail": "RuntimeError: pad torn"}
    rejected = reference["create rejected by the constructor"]
    assert rejected["status"] == 500 and rejected["body"]["detail"].startswith("ValidationError: 2 validation errors")
    assert reference["ping after a rejected task spec"]["status"] == 404
    assert reference["call after a failed setup"]["body"] == {"detail": "RuntimeError: locker jammed is jammed"}


# ----------------------------------------------------------------------------
# The unmodified openreward client
# ----------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """The client's dataclasses (or lists of them) as plain JSON values."""
    if isinstance(value, list):
        return [plain(item) for item in value]
    return dataclasses.asdict(value)


async def client_episodes(base_url: str) -> dict[str, Any]:
    """What the openreward client reports, for one run of each kind of episode."""
    seen: dict[str, Any] = {}
    api = AsyncEnvironmentsAPI(base_url=base_url, api_key="")
    try:
        env = api.get("convoenv", variant="convoenv")
        seen["environment terminal_tool"] = plain(await env.terminal_tool())
        seen["environment supports_score_group"] = await env.supports_score_group()
        tasks = await env.list_tasks("train")
        async with env.session(task=tasks[0]) as session:
            seen["messages"] = plain(await session.get_messages())
            seen["messages openai"] = await session.get_messages(format="openai")
            seen["messages anthropic"] = await session.get_messages(format="anthropic")
            seen["tools openai"] = await session.list_tools(format="openai")
            seen["terminal_tool"] = plain(await session.terminal_tool())
            seen["is_assistant_message_final"] = await session.is_assistant_message_final()
            seen["supports_score_group"] = await session.supports_score_group()
            seen["note"] = plain(await session.call_tool("note", {"text": "hello"}))
            for name, tool_input in [("nope", {}), ("note", {"words": 1})]:
                with pytest.raises(ToolCallError) as refused:
                    await session.call_tool(name, tool_input)
                seen[f"refused {name}"] = (refused.value.reason, refused.value.detail)
            scores = await session.score_group([
                GroupCandidate(messages=[
                    Message(role="assistant", blocks=[
                        ReasoningBlock(text="six sevens", signature="s"),
                        ToolCallBlock(id="c", name="note", input={"text": "x"}),
                        TextBlock(text="It is 42."),
                    ]),
                ], metadata={"rollout": 7}),
                [Message(role="assistant", blocks=[TextBlock(text="Maybe 41?")])],
            ])
            seen["score_group"] = plain(scores)
            with pytest.raises(ScoreGroupFailed) as failed:
                await session.score_group([])
            seen["score_group failed"] = re.sub(r"sid=[\w-]+", "sid=*", str(failed.value))
            seen["call_terminal_tool"] = plain(await session.call_terminal_tool("  42 "))
            with pytest.raises(ToolCallError) as refused:
                await session.call_tool("note", {"text": "late"})
            seen["refused after finished"] = (refused.value.reason, refused.value.detail)

        # `env.session(toolset=...)` accepts only openreward's built-in names;
        # the session class it builds takes any.
        async with AsyncSession(env, split="train", index=1, api_key=env.api_key, toolset_name="scratchpad") as session:
            seen["toolset tools"] = [tool.name for tool in await session.list_tools()]
            seen["toolset terminal_tool"] = plain(await session.terminal_tool())
            seen["toolset call_terminal_tool"] = plain(await session.call_terminal_tool("Paris"))

        plain_env = api.get("plainenv", variant="plainenv")
        async with plain_env.session(split="train", index=0) as session:
            seen["plain messages"] = plain(await session.get_messages())
            seen["plain terminal_tool"] = await session.terminal_tool()
            with pytest.raises(ScoreGroupUnsupported):
                await session.score_group([[Message(role="assistant", blocks=[TextBlock(text="x")])]])

        slow = api.get("slowstartenv", variant="slowstartenv")
        async with slow.session(task=(await slow.list_tasks("train"))[0]) as session:
            # Setup takes 4 s, the servers wait 1 s: the client rides out the 503s.
            seen["slow prompt"] = plain(await session.get_prompt())
            seen["slow call"] = plain(await session.call_tool("ping_tool"))

        strict = api.get("strictenv", variant="strictenv")
        with pytest.raises(Exception) as rejected:
            async with strict.session(task={"id": 1}):
                seen["session opened on a rejected task spec"] = True  # never: it raises at open
        seen["rejected at session open"] = (type(rejected.value).__name__, str(rejected.value))
    finally:
        await api.aclose()
    return seen


@pytest.fixture(scope="module")
def client_observations(reference_url: str, ours_url: str) -> tuple[dict, dict]:
    return asyncio.run(client_episodes(reference_url)), asyncio.run(client_episodes(ours_url))


def test_openreward_client_gets_the_same_answers(client_observations: tuple[dict, dict]) -> None:
    reference, ours = client_observations
    assert list(ours) == list(reference)
    # The one difference: a tool input error lists the wrong fields (docs/http-bridge.md), after openreward's words.
    assert reference["refused note"][1].startswith("Tool input validation error: [{")
    assert ours["refused note"] == ("input_validation", "Tool input validation error: text: Field required")
    for key in reference:
        if key != "refused note":
            assert ours[key] == reference[key], key


def test_openreward_client_saw_the_features(client_observations: tuple[dict, dict]) -> None:
    reference = client_observations[0]
    assert reference["terminal_tool"] == {"name": "answer", "arg": "answer", "description": "Submit the final answer."}
    assert reference["messages openai"][0] == {"role": "system", "content": "Answer in one word."}
    assert reference["refused nope"][0] == "not_found" and reference["refused note"][0] == "input_validation"
    assert reference["refused after finished"][0] == "episode_finished"
    assert [score["reward"] for score in reference["score_group"]] == [1.0, 0.25]
    assert reference["call_terminal_tool"]["reward"] == 1.0 and reference["call_terminal_tool"]["finished"]
    assert reference["slow prompt"][0]["text"] == "Ready?"
    assert reference["plain terminal_tool"] is None
    assert reference["toolset tools"][-2:] == ["erase", "note"]
    assert reference["toolset terminal_tool"]["name"] == "final"
    assert reference["toolset call_terminal_tool"]["blocks"][0]["text"] == "final: Paris"


# ----------------------------------------------------------------------------
# Reattaching to a group scoring
# ----------------------------------------------------------------------------


async def reattached_scoring(base_url: str, workdir: Path) -> dict:
    """Start a scoring that holds, leave after its task id, release it, and
    attach again with the task id: the result of the one scoring."""
    workdir.mkdir(exist_ok=True)
    hold, sid = workdir / "release-scoring", uuid.uuid4().hex
    headers = {"X-Session-ID": sid}
    async with aiohttp.ClientSession(base_url=base_url) as http:
        task = {**TASKS[0], "hold_scoring": str(hold)}
        async with http.post("/create", json={"env_name": "convoenv", "task_spec": task}, headers=headers):
            pass
        body = {"candidates": [candidate("42"), candidate("no")]}
        async with http.post("/convoenv/score_group", json=body, headers=headers) as response:
            assert (await response.content.readline()).strip() == b"event: task_id"
            task_id = (await response.content.readline()).decode().strip().removeprefix("data: ")
        hold.touch()
        async with http.post("/convoenv/score_group", json={"candidates": [], "task_id": task_id},
                             headers=headers) as response:
            again = parse_sse(await response.text())
        async with http.post("/delete", headers=headers):
            pass
    return {"task id again": again.data("task_id") == task_id, "events": again.names(),
            "scores": json.loads(again.data("end"))}


def test_score_group_reattaches_by_task_id(reference_url: str, ours_url: str, tmp_path: Path) -> None:
    reference = asyncio.run(reattached_scoring(reference_url, tmp_path / "openreward"))
    ours = asyncio.run(reattached_scoring(ours_url, tmp_path / "ours"))
    assert ours == reference == {
        "task id again": True, "events": ["task_id", "end"],
        "scores": {"scores": [{"reward": 1.0, "metadata": {"rank": 1, "echo": None}},
                              {"reward": 0.25, "metadata": None}]},
    }


# ----------------------------------------------------------------------------
# The concurrency rules, seen in the environment's log
# ----------------------------------------------------------------------------

#: Waits for a log line (an event in the environment, not a clock) give up after this long.
EVENT_LIMIT_S = 30.0
#: How long to let a request reach the server before checking it did NOT start.
ARRIVAL_GAP_S = 1.0


class Episode:
    """One session with a log file; calls run in the background, holds are files."""

    def __init__(self, http: aiohttp.ClientSession, workdir: Path) -> None:
        self.http = http
        self.workdir = workdir
        self.sid = uuid.uuid4().hex
        self.log = workdir / f"{self.sid}.log"
        self.calls: list[asyncio.Task] = []
        self.held: list[str] = []

    async def __aenter__(self) -> "Episode":
        task = {**TASKS[0], "log": str(self.log)}
        body = {"env_name": "convoenv", "task_spec": task}
        async with self.http.post("/create", json=body, headers={"X-Session-ID": self.sid}) as response:
            assert response.status == 200, await response.text()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for label in self.held:  # after a failed check too: nothing waits for HOLD_LIMIT_S
            self.release(label)
        await asyncio.gather(*self.calls, return_exceptions=True)
        async with self.http.post("/delete", headers={"X-Session-ID": self.sid}):
            pass

    def hold(self, label: str) -> str:
        return str(self.workdir / f"{self.sid}-{label}.release")

    def release(self, label: str) -> None:
        Path(self.hold(label)).touch()

    def start(self, tool: str, label: str, held: bool = False, **tool_input: Any) -> asyncio.Task:
        tool_input = {"label": label, **tool_input}
        if held:
            tool_input["hold"] = self.hold(label)
            self.held.append(label)
        task = asyncio.ensure_future(self._call(tool, tool_input))
        self.calls.append(task)
        return task

    async def _call(self, tool: str, tool_input: dict) -> dict:
        body = {"name": tool, "input": tool_input}
        async with self.http.post("/convoenv/call", json=body, headers={"X-Session-ID": self.sid}) as response:
            return observe_sse(await response.text())["result"]

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    async def logged(self, line: str) -> None:
        waited = 0.0
        while line not in self.lines():
            assert waited < EVENT_LIMIT_S, f"never logged {line!r}: {self.lines()}"
            await asyncio.sleep(0.02)
            waited += 0.02


async def concurrent_calls_overlap(episode: Episode) -> list[str]:
    episode.start("peek", "A", held=True)
    await episode.logged("start:A")
    episode.start("peek", "B", held=True)
    await episode.logged("start:B")  # while A is held: they overlap
    episode.release("A")
    await episode.logged("end:A")
    episode.release("B")
    await episode.logged("end:B")
    return episode.lines()


async def same_tool_takes_turns_other_tools_do_not_wait(episode: Episode) -> list[str]:
    episode.start("scribble", "A", held=True)
    await episode.logged("start:A")
    second = episode.start("scribble", "B")
    await episode.start("tally", "C")  # another tool runs meanwhile
    await asyncio.sleep(ARRIVAL_GAP_S)
    assert "start:B" not in episode.lines(), episode.lines()  # queued behind A
    episode.release("A")
    await second
    return episode.lines()


async def exclusive_waits_for_all_and_holds_later_calls(episode: Episode) -> list[str]:
    episode.start("peek", "A", held=True)
    await episode.logged("start:A")
    exclusive = episode.start("checkpoint", "X")
    await asyncio.sleep(ARRIVAL_GAP_S)
    later = episode.start("peek", "B")  # a concurrent call, queued behind the waiting exclusive one
    await asyncio.sleep(ARRIVAL_GAP_S)
    assert episode.lines() == ["start:A"], episode.lines()
    episode.release("A")
    await exclusive
    await later
    return episode.lines()


async def terminal_is_exclusive_and_ends_the_episode(episode: Episode) -> list[Any]:
    episode.start("peek", "A", held=True)
    await episode.logged("start:A")
    answer = episode.start("answer", "unused", answer="42")
    await asyncio.sleep(ARRIVAL_GAP_S)
    later = episode.start("peek", "B")
    await asyncio.sleep(ARRIVAL_GAP_S)
    assert episode.lines() == ["start:A"], episode.lines()
    episode.release("A")
    answered, refused = await answer, await later
    return [*episode.lines(), answered["output"]["finished"], refused["reason"]]


RULES: dict[str, tuple[Callable[[Episode], Awaitable[list]], list]] = {
    "concurrent": (concurrent_calls_overlap, ["start:A", "start:B", "end:A", "end:B"]),
    "default": (
        same_tool_takes_turns_other_tools_do_not_wait,
        ["start:A", "start:C", "end:C", "end:A", "start:B", "end:B"],
    ),
    "exclusive": (
        exclusive_waits_for_all_and_holds_later_calls,
        ["start:A", "end:A", "start:X", "end:X", "start:B", "end:B"],
    ),
    "terminal": (terminal_is_exclusive_and_ends_the_episode, ["start:A", "end:A", True, "episode_finished"]),
}


async def concurrency_logs(base_url: str, workdir: Path) -> dict[str, list]:
    logs = {}
    async with aiohttp.ClientSession(base_url=base_url) as http:
        for name, (rule, _) in RULES.items():
            async with Episode(http, workdir) as episode:
                logs[name] = await rule(episode)
    return logs


@pytest.mark.parametrize("side", ["openreward", "ours"])
def test_concurrency_rules(side: str, reference_url: str, ours_url: str, tmp_path: Path) -> None:
    url = reference_url if side == "openreward" else ours_url
    logs = asyncio.run(concurrency_logs(url, tmp_path))
    assert logs == {name: expected for name, (_, expected) in RULES.items()}
