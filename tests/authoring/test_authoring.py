"""The authoring API is a drop-in for the reference SDK's (ors-sdk 0.1.0)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from importlib import metadata
from pathlib import Path

import openreward.environments as openreward_environments
import ors
import pytest
from pydantic import BaseModel

import ors_grpc
from ors_grpc import Environment, Split, TextBlock, ToolOutput, Toolset, tool
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from tests.support.grpc_calls import call_tool, create_episode, serving
from tests.support.servers import ROOT

MODELS = ["TextBlock", "ImageBlock", "ToolOutput", "RunToolSuccess", "ToolSpec", "ToolCall", "Split"]
# openreward's supersets of ors-sdk models, and its own additions.
OPENREWARD_MODELS = ["RunToolError", "RunToolOutput", "ListToolsOutput", "TerminalToolSpec", "Message",
                     "ReasoningBlock", "ToolCallBlock", "ToolResultBlock", "GroupCandidate", "GroupScore"]


def test_every_public_name_of_the_reference_exists() -> None:
    missing = [name for name in ors.__all__ if not hasattr(ors_grpc, name)]
    assert missing == []


def test_every_authoring_name_of_openreward_exists() -> None:
    # download_text/upload_text are openreward's sandbox helpers, not part of the ORS surface.
    missing = [name for name in openreward_environments.__all__
               if not hasattr(ors_grpc, name) and name not in ("download_text", "upload_text")]
    assert missing == []


@pytest.mark.parametrize("name", MODELS)
def test_models_have_the_reference_schemas(name: str) -> None:
    ours, theirs = getattr(ors_grpc, name), getattr(ors, name)
    assert json.dumps(ours.model_json_schema()) == json.dumps(theirs.model_json_schema())


def _without_descriptions(schema: object) -> object:
    """A JSON schema without `description` keys (pydantic takes them from docstrings)."""
    if isinstance(schema, dict):
        return {key: _without_descriptions(value) for key, value in schema.items() if key != "description"}
    if isinstance(schema, list):
        return [_without_descriptions(value) for value in schema]
    return schema


@pytest.mark.parametrize("name", OPENREWARD_MODELS)
def test_superset_models_have_openreward_schemas(name: str) -> None:
    ours, theirs = getattr(ors_grpc, name), getattr(openreward_environments, name)
    assert json.dumps(_without_descriptions(ours.model_json_schema())) == json.dumps(
        _without_descriptions(theirs.model_json_schema()))


def test_create_session_is_the_reference_one_plus_toolset_name() -> None:
    ours = ors_grpc.CreateSession.model_json_schema()
    theirs = ors.CreateSession.model_json_schema()
    assert ours["properties"].pop("toolset_name") == {
        "anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Toolset Name"}
    assert ours == theirs


@pytest.mark.parametrize("role, block, allowed", [
    ("system", {"text": "t"}, True),
    ("system", {"type": "reasoning", "text": "r"}, False),
    ("user", {"type": "tool_result", "tool_call_id": "c", "blocks": []}, True),
    ("user", {"type": "tool_call", "id": "c", "name": "f", "input": {}}, False),
    ("assistant", {"type": "tool_call", "id": "c", "name": "f", "input": {}}, True),
    ("assistant", {"type": "reasoning", "text": "r"}, True),
    ("assistant", {"type": "tool_result", "tool_call_id": "c", "blocks": []}, False),
])
def test_message_block_placement_is_validated_as_openreward_does(role: str, block: dict, allowed: bool) -> None:
    def outcome(model: type) -> object:
        try:
            return model.model_validate({"role": role, "blocks": [block]}).model_dump()
        except ValueError as exc:
            return type(exc).__name__
    assert outcome(ors_grpc.Message) == outcome(openreward_environments.Message)
    assert (outcome(ors_grpc.Message) != "ValidationError") == allowed


def test_models_dump_like_the_reference() -> None:
    output = {"blocks": [{"text": "t"}, {"data": "aGk=", "mimeType": "image/png", "detail": {"b": 1, "a": 1.0}}],
              "metadata": {"big": 2**70}, "reward": None}
    ours = ors_grpc.ToolOutput.model_validate(output).model_dump_json()
    assert ours == ors.ToolOutput.model_validate(output).model_dump_json()
    assert json.loads(ours)["metadata"]["big"] == 2**70


def _reference_readme_server_example() -> str:
    """The server example of the reference SDK's README (from its package metadata)."""
    readme = metadata.metadata("ors-sdk").get_payload()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    return next(block for block in blocks if "class MathEnv" in block)


def _ported(source: str) -> str:
    """The reference source with only its import changed."""
    ported = source.replace("from ors import", "from ors_grpc import")
    assert ported.count("ors_grpc") == 1
    return ported


async def test_reference_readme_example_runs_with_only_the_import_changed() -> None:
    module = types.ModuleType("readme_example")
    exec(compile(_ported(_reference_readme_server_example()), "readme_example", "exec"), module.__dict__)
    async with serving([module.MathEnv]) as stub:
        tasks = await stub.ListTasks(pb.ListTasksRequest(env_name="mathenv", split="test"))
        task = json.loads(tasks.tasks[0].spec.json)
        sid = await create_episode(stub, "mathenv", task_spec=task)
        prompt = await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
        assert prompt.blocks[0].text.text == "What is 2+2?"
        _, event = await call_tool(stub, sid, "submit", {"answer": "4"})
        assert (event.result.output.reward, event.result.output.finished) == (1.0, True)


def test_reference_readme_example_serves_the_reference_client(tmp_path: Path) -> None:
    """`Server([MathEnv]).run(...)` is a drop-in too: the reference client talks to it over HTTP."""
    script = tmp_path / "readme_server.py"
    source = _ported(_reference_readme_server_example())
    source = source.replace("Server([MathEnv]).run(port=8080)",
                            'Server([MathEnv]).run(host="127.0.0.1", port=0, grpc_port=0)')
    script.write_text(source)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        http_url = _wait_for_http_door(proc)
        from ors.client import ORS

        client = ORS(base_url=http_url)
        env = client.environment("mathenv")
        tasks = env.list_tasks(split="test")
        with env.session(task=tasks[0]) as session:
            assert session.get_prompt()[0].text == "What is 2+2?"
            result = session.call_tool("submit", {"answer": "4"})
            assert (result.reward, result.finished) == (1.0, True)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def _wait_for_http_door(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.match(r"HTTP listening on (\S+):(\d+)", line)
        if match:
            return f"http://{match.group(1)}:{match.group(2)}"
    raise AssertionError(f"server exited with {proc.wait()} before listening")


class NumberInput(BaseModel):
    n: int


class Shout(Toolset):
    @tool
    def shout(self, params: NumberInput) -> ToolOutput:
        """Shout a number, with the environment's name."""
        return ToolOutput(blocks=[TextBlock(text=f"{params.n}! from {type(self.env).__name__}")])


class AuthoredEnv(Environment):
    """Uses the authoring API's features: toolsets, async hooks, index defaults."""

    toolsets = [Shout]
    teardowns: list[str] = []

    @classmethod
    def list_splits(cls):
        return [Split(name="dev", type="validation")]

    @classmethod
    async def list_tasks(cls, split):
        return [{"k": i} for i in range(5)]

    async def setup(self) -> None:
        self.greeting = "set up"

    async def get_prompt(self):
        return [TextBlock(text=self.greeting)]

    async def teardown(self) -> None:
        type(self).teardowns.append("done")

    @tool
    async def double(self, params: NumberInput) -> ToolOutput:
        """Double a number."""
        return ToolOutput(blocks=[TextBlock(text=str(2 * params.n))])

    @tool(shared=False)
    def private(self) -> ToolOutput:
        return ToolOutput(blocks=[TextBlock(text="private")])


def test_tool_listing_follows_the_reference_rules() -> None:
    tools = {spec.name: spec for spec in AuthoredEnv.list_tools().tools}
    assert sorted(tools) == ["double", "shout"]
    assert tools["double"].description == "Double a number."
    assert tools["shout"].input_schema == NumberInput.model_json_schema()


def test_toolset_name_collisions_are_refused() -> None:
    class Colliding(AuthoredEnv):
        @tool
        def shout(self) -> ToolOutput:
            return ToolOutput(blocks=[])

    with pytest.raises(ValueError, match="Tool name collision"):
        Colliding.list_tools()


async def test_index_defaults_and_async_hooks_over_grpc() -> None:
    AuthoredEnv.teardowns = []
    assert await AuthoredEnv.num_tasks("dev") == 5
    assert await AuthoredEnv.get_task("dev", 4) == {"k": 4}
    assert await AuthoredEnv.get_task_range("dev", -2) == [{"k": 3}, {"k": 4}]
    async with serving([AuthoredEnv]) as stub:
        sid = await create_episode(stub, "authoredenv", split="dev", index=2)
        assert (await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))).blocks[0].text.text == "set up"
        _, event = await call_tool(stub, sid, "shout", {"n": 3})
        assert event.result.output.blocks[0].text.text == "3! from AuthoredEnv"
        _, event = await call_tool(stub, sid, "double", {"n": 21})
        assert event.result.output.blocks[0].text.text == "42"
        _, event = await call_tool(stub, sid, "private")  # callable though not listed
        assert event.result.output.blocks[0].text.text == "private"
        _, event = await call_tool(stub, sid, "teardown", {})  # a method, not a tool
        assert event.result.error == "'teardown' is not a valid tool"
        await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
    assert AuthoredEnv.teardowns == ["done"]


def _no_return(self):  # type: ignore[no-untyped-def]
    raise AssertionError("never called")


def _plain_int(self, n: int) -> ToolOutput:
    raise AssertionError("never called")


def _two_models(self, a: NumberInput, b: NumberInput) -> ToolOutput:
    raise AssertionError("never called")


def _returns_str(self) -> str:
    raise AssertionError("never called")


def _unannotated(self, params) -> ToolOutput:  # type: ignore[no-untyped-def]
    raise AssertionError("never called")


def _variadic(self, **params: NumberInput) -> ToolOutput:
    raise AssertionError("never called")


def _keyword_only(self, *, params: NumberInput) -> ToolOutput:
    raise AssertionError("never called")


@pytest.mark.parametrize(
    ("method", "problem"),
    [
        (tool(_no_return), "it has no return annotation"),
        (tool(_plain_int), "its argument `n` is a `int`, not a pydantic BaseModel"),
        (tool(_two_models), "it takes 2 arguments (a, b)"),
        (tool(_returns_str), "it is annotated `-> str`"),
        (tool(_unannotated), "its argument `params` has no annotation"),
        (tool(_variadic), "its argument `**params` cannot be passed positionally"),
        (tool(_keyword_only), "its argument `params` cannot be passed positionally"),
        (tool(shared=False)(_plain_int), "its argument `n` is a `int`, not a pydantic BaseModel"),
    ],
    ids=["no-return", "plain-int", "two-models", "returns-str", "unannotated", "variadic", "keyword-only", "task-tool"],
)
def test_a_tool_signature_that_cannot_work_is_an_error_naming_method_and_rule(method, problem: str) -> None:
    # The reference drops such a method without a word; the environment then lacks a tool its author wrote.
    broken = type("Broken", (AuthoredEnv,), {"broken": method})
    with pytest.raises(ors_grpc.authoring.environment.ToolSignatureError) as caught:
        broken.list_tools()
    assert str(caught.value) == (
        f"tool Broken.broken: {problem}; "
        "a @tool takes no argument or one pydantic BaseModel and is annotated `-> ToolOutput`"
    )


async def test_a_tool_taking_its_model_as_star_args_works_as_under_the_reference() -> None:
    @tool
    def double(self, *params: NumberInput) -> ToolOutput:
        return ToolOutput(blocks=[TextBlock(text=str(2 * params[0].n))])

    env_cls = type("StarArgs", (AuthoredEnv,), {"double": double})
    assert "double" in {spec.name for spec in env_cls.list_tools().tools}
    result = await env_cls({}, {})._call_tool("double", {"n": 4})
    assert result.root.output.blocks[0].text == "8"


def test_a_toolset_tool_with_a_signature_that_cannot_work_is_an_error() -> None:
    class BrokenToolset(Toolset):
        plain_int = tool(_plain_int)

    broken = type("WithBrokenToolset", (AuthoredEnv,), {"toolsets": [Shout, BrokenToolset]})
    with pytest.raises(ors_grpc.authoring.environment.ToolSignatureError, match=r"^tool BrokenToolset.plain_int: its argument"):
        broken.list_tools()


async def test_tool_returning_the_wrong_type_fails() -> None:
    class WrongReturn(AuthoredEnv):
        @tool
        def wrong(self) -> ToolOutput:
            return "not an output"  # type: ignore[return-value]

    with pytest.raises(TypeError, match="expected ToolOutput"):
        await WrongReturn({}, {})._call_tool("wrong", {})


def test_test_environments_use_the_authoring_api_in_one_import_line() -> None:
    # The differential test swaps this one line for `from ors import ...`.
    source = (ROOT / "tests" / "support" / "environments.py").read_text()
    mentions = [line for line in source.splitlines() if "ors_grpc" in line]
    assert len(mentions) == 1 and mentions[0].startswith("from ors_grpc import ")
