"""One scripted HTTP scenario against the reference server (ors-sdk 0.1.0) and against our bridge.

Both host `tests/support/environments.py` (the reference after the one import line
is switched to `from ors import ...`). Every step's status and body must be
identical, after normalizing random ids, except the steps in `EXCEPTIONS`,
each with its reason and the check that replaces equality.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, Iterator

import aiohttp
import pytest

from tests.support.differential import (
    FIELDS_REASON, SPECIFICS_REASON, SSE, Check, Step, adds_specifics, assert_exceptions_name_real_steps,
    assert_same_answer, canonical, lists_the_wrong_fields, observe_sse,
)
from tests.support.servers import SERVE_APP_ON_A_FREE_PORT, ServeProcess, start_script_server, start_serve

ENVIRONMENTS = ["EchoEnv", "SlowSetupEnv", "FailingSetupEnv"]

# Runs the reference server on a free loopback port and announces it like `ors-grpc serve`.
REFERENCE_SERVER = f"""
import os, socket, sys, types
from pathlib import Path
import uvicorn
source = Path("tests/support/environments.py").read_text().replace("from ors_grpc import", "from ors import")
module = types.ModuleType("reference_environments")
sys.modules[module.__name__] = module
exec(compile(source, "tests/support/environments.py", "exec"), module.__dict__)
from ors import Server
server = Server([{", ".join(f"module.{name}" for name in ENVIRONMENTS)}])
""" + SERVE_APP_ON_A_FREE_PORT


def secrets_header(names: dict[str, str]) -> str:
    return base64.b64encode(json.dumps({k: {"value": v} for k, v in names.items()}).encode()).decode()


SCENARIO = [
    # Discovery
    Step("health", "GET", "/health"),
    Step("list_environments", "GET", "/list_environments"),
    Step("version", "GET", "/version"),
    Step("tools", "GET", "/echoenv/tools"),
    Step("tools case-insensitive", "GET", "/EchoEnv/tools"),
    Step("tools bare path", "GET", "/tools?q=1"),
    Step("tools unknown env", "GET", "/nowhere/tools"),
    Step("splits", "GET", "/echoenv/splits", sid="throwaway"),
    Step("tasks", "POST", "/echoenv/tasks", {"split": "train"}),
    Step("tasks env name as given", "POST", "/EchoEnv/tasks", {"split": "test"}),
    Step("tasks invalid split", "POST", "/echoenv/tasks", {"split": "nope"}),
    Step("num_tasks", "POST", "/echoenv/num_tasks", {"split": "train"}),
    Step("num_tasks invalid split", "POST", "/echoenv/num_tasks", {"split": "nope"}),
    Step("task", "POST", "/echoenv/task", {"split": "train", "index": 1}),
    Step("task invalid index", "POST", "/echoenv/task", {"split": "train", "index": 3}),
    Step("task invalid split", "POST", "/echoenv/task", {"split": "nope", "index": 0}),
    Step("task alias", "POST", "/echoenv/get_task", {"split": "train", "index": 1}),
    Step("task_range", "POST", "/echoenv/task_range", {"split": "train", "start": -2, "stop": 10}),
    Step("task_range open", "POST", "/echoenv/task_range", {"split": "test"}),
    Step("task_range alias", "POST", "/echoenv/get_task_range", {"split": "train", "start": 1}),
    Step("tasks extra field", "POST", "/echoenv/tasks", {"split": "train", "extra": 1}),
    Step("tasks not json", "POST", "/echoenv/tasks", b"{not json"),
    Step("tasks not an object", "POST", "/echoenv/tasks", [1, 2]),
    Step("task wrong type", "POST", "/echoenv/task", {"split": "train", "index": "one"}),
    Step("task missing field", "POST", "/echoenv/task", {"split": "train"}),
    # Session ids
    Step("create_session sse", "POST", "/create_session", headers=SSE),
    Step("create_session json", "POST", "/create_session"),
    Step("delete_session", "POST", "/delete_session", sid="free-id"),
    Step("delete_session without id", "POST", "/delete_session"),
    # Episode from split + index
    Step("create without id", "POST", "/create", {"split": "train", "index": 0}),
    Step("create", "POST", "/create", {"split": "train", "index": 0}, sid="ep-1"),
    Step("create again", "POST", "/create", {"split": "train", "index": 0}, sid="ep-1"),
    Step("create unknown env", "POST", "/create", {"env_name": "nope", "split": "train", "index": 0}, sid="ep-x"),
    Step("create invalid split", "POST", "/create", {"split": "nope", "index": 0}, sid="ep-x"),
    Step("create invalid index", "POST", "/create", {"split": "train", "index": 7}, sid="ep-x"),
    Step("create both sources", "POST", "/create", {"task_spec": {"a": 1}, "split": "train", "index": 0}, sid="ep-x"),
    Step("create no source", "POST", "/create", {"env_name": "echoenv"}, sid="ep-x"),
    Step("prompt", "GET", "/echoenv/prompt", sid="ep-1"),
    Step("prompt without id", "GET", "/echoenv/prompt"),
    Step("task_tools", "GET", "/echoenv/task_tools", sid="ep-1"),
    Step("task_tools other env path", "GET", "/slowsetupenv/task_tools", sid="ep-1"),
    Step("call echo", "POST", "/echoenv/call", {"name": "echo", "input": {"text": "hi ✓"}}, sid="ep-1", headers=SSE),
    Step("call add", "POST", "/echoenv/call", {"name": "add", "input": {"a": 2, "b": 40}}, sid="ep-1"),
    Step("call metadata", "POST", "/echoenv/call", {"name": "metadata", "input": {}}, sid="ep-1"),
    Step("call big", "POST", "/echoenv/call", {"name": "big", "input": {"chars": 50_000}}, sid="ep-1"),
    Step("call image", "POST", "/echoenv/call", {"name": "image", "input": {"size": 3000}}, sid="ep-1"),
    Step("call fail", "POST", "/echoenv/call", {"name": "fail", "input": {}}, sid="ep-1"),
    Step("call unknown tool", "POST", "/echoenv/call", {"name": "nope", "input": {}}, sid="ep-1"),
    Step("call bad input", "POST", "/echoenv/call", {"name": "add", "input": {"a": "x"}}, sid="ep-1"),
    Step("call unknown task_id", "POST", "/echoenv/call", {"name": "echo", "input": {}, "task_id": "0" * 32}, sid="ep-1"),
    Step("call bad body", "POST", "/echoenv/call", {"name": "echo"}, sid="ep-1"),
    Step("call hint", "POST", "/echoenv/call", {"name": "hint", "input": {}}, sid="ep-1"),
    Step("call secret", "POST", "/echoenv/call", {"name": "secret", "input": {}}, sid="ep-1"),
    Step("ping", "POST", "/ping", sid="ep-1"),
    Step("call submit", "POST", "/echoenv/call", {"name": "submit", "input": {"answer": "hello"}}, sid="ep-1"),
    Step("call after finished", "POST", "/echoenv/call", {"name": "echo", "input": {"text": "x"}}, sid="ep-1"),
    Step("delete", "POST", "/delete", sid="ep-1"),
    Step("delete again", "POST", "/delete", sid="ep-1"),
    Step("ping after delete", "POST", "/ping", sid="ep-1"),
    Step("prompt after delete", "GET", "/echoenv/prompt", sid="ep-1"),
    Step("call after delete", "POST", "/echoenv/call", {"name": "echo", "input": {}}, sid="ep-1"),
    Step("ping without id", "POST", "/ping"),
    # Episode from a task spec, with secrets in the body and in the header
    Step(
        "create from task_spec",
        "POST",
        "/create",
        {"env_name": "EchoEnv", "task_spec": {"id": 9, "answer": "a", "big": 2**70, "f": 1.0}, "secrets": {"BODY": "b"}},
        sid="ep-2",
        headers={"X-Secrets": secrets_header({"HEADER": "h"})},
    ),
    Step("secret from body and header", "POST", "/echoenv/call", {"name": "secret", "input": {}}, sid="ep-2"),
    Step("task_tools without task tools", "GET", "/echoenv/task_tools", sid="ep-2"),
    Step("delete_session with episode", "POST", "/delete_session", sid="ep-2"),
    Step("ping after delete_session", "POST", "/ping", sid="ep-2"),
    # Setup: slow, failing
    Step("create slow", "POST", "/create", {"env_name": "slowsetupenv", "split": "test", "index": 1}, sid="ep-3"),
    Step("prompt waits for setup", "GET", "/slowsetupenv/prompt", sid="ep-3"),
    Step("create failing", "POST", "/create", {"env_name": "failingsetupenv", "split": "train", "index": 0}, sid="ep-4"),
    Step("prompt setup failed", "GET", "/failingsetupenv/prompt", sid="ep-4"),
    Step("call setup failed", "POST", "/failingsetupenv/call", {"name": "echo", "input": {}}, sid="ep-4"),
    Step("delete failing", "POST", "/delete", sid="ep-4"),
    # Routing
    Step("unknown route", "GET", "/echoenv/nothing"),
    Step("wrong method", "PUT", "/health"),
]


# ----------------------------------------------------------------------------
# Exceptions: where our bridge differs from the reference on purpose
# ----------------------------------------------------------------------------

def same_status_string_detail(reference: dict, ours: dict) -> bool:
    """Reference 422s carry pydantic's error list; ours a string that names the field."""
    return reference["status"] == ours["status"] == 422 and isinstance(ours["body"]["detail"], str)


def ours_adds_env_name(reference: dict, ours: dict) -> bool:
    body = dict(ours["body"])
    return body.pop("env_name") == "echoenv" and canonical({**ours, "body": body}) == canonical(reference)


#: What the openreward SDK (>= 0.1.157) added to the tool listings; the ors-sdk client reads `tools` only.
OPENREWARD_LISTING = {
    "terminal_tool": None,
    "supports_score_group": False,
    "message_block_types": ["text", "image", "reasoning", "tool_call", "tool_result"],
}


def ours_adds_openreward_listing(reference: dict, ours: dict) -> bool:
    body = dict(ours["body"])
    added = {key: body.pop(key) for key in OPENREWARD_LISTING}
    return added == OPENREWARD_LISTING and canonical({**ours, "body": body}) == canonical(reference)


def ours_adds_reason(reason: str) -> Check:
    def check(reference: dict, ours: dict) -> bool:
        result = dict(ours["body"]["result"])
        return result.pop("reason") == reason and canonical(
            {**ours, "body": {**ours["body"], "result": result}}
        ) == canonical(reference)

    return check


LISTING_REASON = "we add openreward's fields to tool listings (terminal_tool, supports_score_group, message_block_types)"
REASON_REASON = "refusals carry openreward's `reason`"

EXCEPTIONS: dict[str, tuple[str, Check]] = {
    "tools": (LISTING_REASON, ours_adds_openreward_listing),
    "tools case-insensitive": (LISTING_REASON, ours_adds_openreward_listing),
    "task_tools": (LISTING_REASON, ours_adds_openreward_listing),
    "task_tools other env path": (LISTING_REASON, ours_adds_openreward_listing),
    "task_tools without task tools": (LISTING_REASON, ours_adds_openreward_listing),
    "call unknown tool": (REASON_REASON, ours_adds_reason("not_found")),
    "call bad input": (FIELDS_REASON, lists_the_wrong_fields(
        "a: Input should be a valid integer, unable to parse string as an integer (got 'x')", "b: Field required")),
    **{name: (SPECIFICS_REASON, adds_specifics) for name in (
        "tasks invalid split", "num_tasks invalid split", "task invalid index", "task invalid split",
        "create unknown env", "create invalid split", "create invalid index",
        "ping after delete", "prompt after delete", "call after delete",
    )},
    "version": (
        "GET /version is a spec decision; the reference has no such route (308, then 404)",
        lambda ref, ours: ref["status"] == 308 and ours["status"] == 200 and set(ours["body"]) == {"version"},
    ),
    "tools unknown env": (
        "an unknown environment is a 404 naming the hosted ones; the reference 308s to a bare 404",
        lambda ref, ours: ref["status"] == 308 and ours["status"] == 404
        and ours["body"]["detail"].startswith("unknown environment 'nowhere'; this server hosts: echoenv"),
    ),
    "task alias": (
        "/{env}/get_task is a spec decision (the spec's alternative name); the reference 404s",
        lambda ref, ours: ref["status"] == 404 and ours["status"] == 200,
    ),
    "task_range alias": (
        "/{env}/get_task_range is a spec decision (the spec's alternative name); the reference 404s",
        lambda ref, ours: ref["status"] == 404 and ours["status"] == 200,
    ),
    "task": ("we add env_name, which the openreward client reads (the reference breaks it)", ours_adds_env_name),
    "task_range": ("we add env_name, which the openreward client reads", ours_adds_env_name),
    "task_range open": ("we add env_name, which the openreward client reads", ours_adds_env_name),
    "tasks extra field": (
        "unknown extra body fields are ignored (spec decision); the reference forbids them (422)",
        lambda ref, ours: ref["status"] == 422 and ours["status"] == 200,
    ),
    "tasks not json": ("422 detail: string vs pydantic list", same_status_string_detail),
    "tasks not an object": ("422 detail: string vs pydantic list", same_status_string_detail),
    "task wrong type": ("422 detail: string vs pydantic list", same_status_string_detail),
    "task missing field": ("422 detail: string vs pydantic list", same_status_string_detail),
    "create both sources": ("422 detail: string vs pydantic list", same_status_string_detail),
    "create no source": ("422 detail: string vs pydantic list", same_status_string_detail),
    "call bad body": ("422 detail: string vs pydantic list", same_status_string_detail),
    "create_session json": (
        "/create_session answers JSON without `Accept: text/event-stream` (spec decision); the reference always SSE",
        lambda ref, ours: ref["body"]["events"] == ["task_id", "end"] and set(ours["body"]) == {"sid"},
    ),
    "call after finished": (
        "a finished episode refuses further calls (spec decision); the reference runs the tool",
        lambda ref, ours: ref["body"]["result"]["ok"] is True
        and ours["body"]["result"]["ok"] is False
        and ours["body"]["result"]["reason"] == "episode_finished"
        and ours["body"]["result"]["error"].endswith("the episode has finished (a tool returned finished=True), "
                                                     "so no further tool calls are accepted."),
    ),
    "secret from body and header": (
        "secrets from X-Secrets are merged in (spec decision); the reference ignores that header",
        lambda ref, ours: ref["body"]["result"]["output"]["blocks"][0]["text"] == "secret:['BODY']"
        and ours["body"]["result"]["output"]["blocks"][0]["text"] == "secret:['BODY', 'HEADER']",
    ),
    "ping after delete_session": (
        "/delete_session also ends the session's episode (proto contract: nothing lingers); "
        "the reference keeps the episode alive until /delete or the reaper",
        lambda ref, ours: ref["status"] == 200 and ours["status"] == 404,
    ),
}


# ----------------------------------------------------------------------------
# Running the scenario
# ----------------------------------------------------------------------------


async def observe(http: aiohttp.ClientSession, step: Step) -> dict:
    headers = dict(step.headers)
    if step.sid is not None:
        headers["X-Session-ID"] = step.sid
    options: dict[str, Any] = {"headers": headers, "allow_redirects": False}
    if isinstance(step.body, bytes):
        options["data"] = step.body
        headers["Content-Type"] = "application/json"
    elif step.body is not None:
        options["json"] = step.body
    async with http.request(step.method, step.path, **options) as response:
        text = await response.text()
        observation: dict[str, Any] = {"status": response.status}
        if response.status == 308:
            observation["location"] = response.headers["Location"]
        elif response.headers.get("Content-Type", "").startswith("text/event-stream"):
            observation["body"] = observe_sse(text)
        else:
            observation["body"] = json.loads(text)
        return observation


async def run_scenario(base_url: str) -> dict[str, dict]:
    async with aiohttp.ClientSession(base_url=base_url) as http:
        return {step.name: await observe(http, step) for step in SCENARIO}


@pytest.fixture(scope="module")
def reference_url() -> Iterator[str]:
    with start_script_server(REFERENCE_SERVER, name="reference server") as url:
        yield url


@pytest.fixture(scope="module")
def ours() -> Iterator[ServeProcess]:
    with start_serve(*(f"tests.support.environments:{name}" for name in ENVIRONMENTS), "--http-port", "0") as serve:
        yield serve


@pytest.fixture(scope="module")
def observations(reference_url: str, ours: ServeProcess) -> tuple[dict, dict]:
    return asyncio.run(run_scenario(reference_url)), asyncio.run(run_scenario(ours.http_url))


def test_exceptions_name_real_steps() -> None:
    assert_exceptions_name_real_steps(SCENARIO, EXCEPTIONS)


@pytest.mark.parametrize("step", SCENARIO, ids=[step.name for step in SCENARIO])
def test_same_as_reference(observations: tuple[dict, dict], step: Step) -> None:
    assert_same_answer(observations, step, EXCEPTIONS)
