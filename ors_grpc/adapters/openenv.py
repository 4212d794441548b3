"""OpenEnv environments as ORS environments (the `openenv` extra).

    ors-grpc serve openenv:my_envs.echo:EchoEnvironment     # hosted here (and in --workers)
    ors-grpc serve openenv:http://127.0.0.1:8000            # a running OpenEnv server, fronted

An episode is one OpenEnv session: the environment is made (or a WebSocket
session opened, as OpenEnv's own client does) and reset when the episode is
set up, with the task spec as `reset`'s keyword arguments (task `i` of a split
`NAME:SIZE:SEED` is `{"seed": SEED + i}`); the reset observation is the
prompt. An `Environment` has one tool, `step`, whose input is its action
(the action type's JSON schema); an `MCPEnvironment` has its MCP tools one to
one. An observation becomes blocks (image data URLs as images, the rest as
text), its `reward` and `done` the output's `reward` and `finished`, its
`metadata` the output's. docs/ecosystems.md has the rest."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import importlib
import inspect
import json
import sys
import typing
import urllib.parse
import urllib.request
from typing import Any, Awaitable, Callable, Mapping, Sequence

from openenv.core.env_server import Environment as OpenEnvEnvironment
from openenv.core.env_server import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction
from openenv.core.env_server.types import Action
from openenv.core.generic_client import GenericEnvClient
from openenv.core.utils import run_async_safely
import jsonschema
from pydantic import BaseModel, ConfigDict, model_validator

from ors_grpc.adapters._generated import GeneratedEnvironment, generated_class, rebuilt_class
from ors_grpc.adapters._sources import SeededSplit, check_splits, parse_source_spec
from ors_grpc.authoring.environment import Environment, tool
from ors_grpc.authoring.types import ImageBlock, JSONObject, ListToolsOutput, TextBlock, ToolOutput, ToolSpec

__all__ = ["DEFAULT_SPLITS", "environment", "environments_from_spec", "observation_blocks", "remote"]

#: Splits when none are given: `train`, 1000 seeds from 0; `test`, 100 from 1,000,000.
DEFAULT_SPLITS = (SeededSplit("train", 1000, 0), SeededSplit("test", 100, 1_000_000))
#: The tool of an `Environment` (not an MCPEnvironment): OpenEnv's `step`.
STEP_TOOL = "step"
#: Observation fields that are not its content (serialize_observation leaves them out too).
_NOT_CONTENT = frozenset({"reward", "done", "metadata"})
#: Seconds a fronted server may take to answer one message (OpenEnv's client default).
REMOTE_MESSAGE_TIMEOUT_S = 60.0
_DATA_URL_IMAGE = "data:image/"


def environment(env_class: type | str, *, action: type | str | None = None, name: str | None = None,
                splits: Sequence[SeededSplit] = DEFAULT_SPLITS) -> type[Environment]:
    """An OpenEnv `Environment` or `MCPEnvironment` class (or its `module:Class`) as an ORS
    environment hosted in this server; `action`: the action type, when the class's
    `step` annotation or generic parameters do not name it."""
    recipe = {"kind": "class", "target": _import_path(env_class), "action": _import_path(action) if action else None,
              "name": name, "splits": [split.as_json() for split in check_splits(splits)]}
    return _environment_class(json.dumps(recipe, sort_keys=True))


def remote(url: str, *, name: str | None = None, splits: Sequence[SeededSplit] = DEFAULT_SPLITS) -> type[Environment]:
    """A running OpenEnv server (`http(s)://` or `ws(s)://`) fronted as an ORS environment:
    one WebSocket session (OpenEnv's `/ws`) per episode."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https", "ws", "wss"):
        raise ValueError(f"an OpenEnv server's URL is http(s):// or ws(s)://, got {url!r}")
    recipe = {"kind": "url", "target": url.rstrip("/"), "action": None, "name": name,
              "splits": [split.as_json() for split in check_splits(splits)]}
    return _environment_class(json.dumps(recipe, sort_keys=True))


def environments_from_spec(text: str) -> list[type[Environment]]:
    """`ors-grpc serve openenv:TEXT` (the entry point): `MODULE:CLASS` or a URL, and the
    options `split=NAME:SIZE:SEED` (repeatable), `name=NAME`, `action=MODULE:CLASS`."""
    spec = parse_source_spec(text)
    splits = spec.splits or DEFAULT_SPLITS
    name = spec.take("name", str)
    action = spec.take("action", str)
    if spec.options:
        raise ValueError(f"unknown options {sorted(spec.options)}; an OpenEnv source takes split, name and action")
    if "://" in spec.target:
        if action:
            raise ValueError("action= is for a class; a server says its own action type")
        return [remote(spec.target, name=name, splits=splits)]
    return [environment(spec.target, action=action, name=name, splits=splits)]


def __getattr__(name: str) -> Any:
    """A generated environment class, rebuilt from its import name (in a worker process)."""
    return rebuilt_class(__name__, name, _environment_class)


# --- observations -------------------------------------------------------------

def observation_blocks(fields: Mapping[str, Any]) -> list[TextBlock | ImageBlock]:
    """An observation's content (its fields but reward, done, metadata and those that are
    None) as blocks: each `data:image/...;base64,` string an image, the rest one text
    block (a lone string field as it is, otherwise the fields as JSON)."""
    images, rest = [], {}
    for key, value in fields.items():
        if key in _NOT_CONTENT or value is None:
            continue
        image = _data_url_image(value)
        if image is not None:
            images.append(image)
        else:
            rest[key] = value
    if len(rest) == 1 and isinstance(next(iter(rest.values())), str):
        text = next(iter(rest.values()))
    elif rest or not images:
        text = json.dumps(rest, ensure_ascii=False)
    else:
        return images
    return [TextBlock(text=text), *images]


def _data_url_image(value: Any) -> ImageBlock | None:
    if not (isinstance(value, str) and value.startswith(_DATA_URL_IMAGE)):
        return None
    head, sep, data = value.partition(",")
    if not sep or not head.endswith(";base64"):
        return None
    return ImageBlock(data=data, mimeType=head[len("data:"):-len(";base64")])


def _tool_call_output(fields: Mapping[str, Any], reward: Any, done: bool, metadata: Any) -> ToolOutput:
    """A CallToolObservation (as JSON) as a tool's output: the MCP result's content as
    blocks; an MCP error (bad arguments, the tool raised) as text, named in metadata."""
    meta = dict(metadata or {})
    error = fields.get("error")
    result = fields.get("result") or {}
    if error:
        blocks: list[TextBlock | ImageBlock] = [TextBlock(text=str(error.get("message", error)))]
        meta["error"] = error
    else:
        blocks = [_content_block(item) for item in result.get("content", [])]
        if result.get("is_error"):
            meta["is_error"] = True
        if result.get("structured_content") is not None:
            meta.setdefault("structured_content", result["structured_content"])
    return _output(blocks or [TextBlock(text="")], reward, done, meta)


def _content_block(item: Mapping[str, Any]) -> TextBlock | ImageBlock:
    if item.get("type") == "text":
        return TextBlock(text=item.get("text", ""))
    if item.get("type") == "image":
        return ImageBlock(data=item["data"], mimeType=item.get("mime_type") or item.get("mimeType"))
    return TextBlock(text=json.dumps(item, ensure_ascii=False))


def _output(blocks: list[TextBlock | ImageBlock], reward: Any, done: bool, metadata: Mapping[str, Any]) -> ToolOutput:
    return ToolOutput(blocks=blocks, metadata=dict(metadata) or None,
                      reward=None if reward is None else float(reward), finished=bool(done))


class _Step:
    """One observation as JSON: its fields, reward, done and metadata."""

    def __init__(self, fields: dict[str, Any], reward: Any, done: bool, metadata: Any = None) -> None:
        self.fields, self.reward, self.done, self.metadata = fields, reward, done, metadata

    @classmethod
    def of(cls, observation: Any) -> _Step:
        """An in-process Observation (JSON as over OpenEnv's wire, plus its metadata)."""
        fields = observation.model_dump(mode="json", exclude=set(_NOT_CONTENT))
        metadata = observation.model_dump(mode="json", include={"metadata"}).get("metadata")
        return cls(fields, observation.reward, observation.done, metadata)

    def output(self, mcp_tool: bool) -> ToolOutput:
        if mcp_tool:
            return _tool_call_output(self.fields, self.reward, self.done, self.metadata)
        return _output(observation_blocks(self.fields), self.reward, self.done, self.metadata or {})


# --- where an episode's OpenEnv session lives ------------------------------------

class _Arguments(BaseModel):
    """An MCP tool's arguments, checked by the tool itself (its schema is the tool's)."""

    model_config = ConfigDict(extra="allow")


def _checked_against(schema: dict[str, Any]) -> type[BaseModel]:
    """An input model that takes what `schema` (a fronted server's action schema) accepts:
    an action it refuses is refused here (input_validation), before it travels."""
    validator = jsonschema.validators.validator_for(schema)(schema)

    class Action(_Arguments):
        @model_validator(mode="before")
        @classmethod
        def _fits_the_schema(cls, data: Any) -> Any:
            problems = sorted(error.message for error in validator.iter_errors(data))
            if problems:
                raise ValueError("; ".join(problems))
            return data

    return Action


class _Session:
    """One OpenEnv session: reset, step (the `step` tool's action, or an MCP tool call as JSON), close."""

    async def reset(self, arguments: dict[str, Any]) -> _Step:
        raise NotImplementedError

    async def step(self, action: BaseModel | dict[str, Any]) -> _Step:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class _LocalSession(_Session):
    """An instance of the class, in this process; sync code in a thread (or, for a class
    that requires one thread, in the class's one thread)."""

    def __init__(self, env_class: type, single_thread: concurrent.futures.Executor | None) -> None:
        self.env_class, self.single_thread = env_class, single_thread
        self.env: Any = None
        self.held = contextlib.AsyncExitStack()

    async def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.single_thread is not None:
            return await asyncio.get_running_loop().run_in_executor(self.single_thread, lambda: fn(*args, **kwargs))
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def reset(self, arguments: dict[str, Any]) -> _Step:
        self.env = await self._run(self.env_class)
        if isinstance(self.env, MCPEnvironment):
            # One MCP client session for the episode, as OpenEnv's server holds one per WebSocket.
            await self.held.enter_async_context(self.env.mcp_session())
        is_async = type(self.env).reset_async is not OpenEnvEnvironment.reset_async
        reset: Callable[..., Any] = self.env.reset_async if is_async else self.env.reset
        kwargs = _accepted(reset, arguments)
        observation = await (reset(**kwargs) if is_async else self._run(reset, **kwargs))
        return _Step.of(observation)

    async def step(self, action: BaseModel | dict[str, Any]) -> _Step:
        if isinstance(action, dict):
            action = CallToolAction(**action)
        if isinstance(action, CallToolAction) or type(self.env).step_async is not OpenEnvEnvironment.step_async:
            return _Step.of(await self.env.step_async(action))
        return _Step.of(await self._run(self.env.step, action))

    async def close(self) -> None:
        try:
            await self.held.aclose()
        finally:
            if self.env is not None:
                await self._run(self.env.close)


class _RemoteSession(_Session):
    """A WebSocket session on a running OpenEnv server, through OpenEnv's own client."""

    def __init__(self, url: str) -> None:
        self.client = GenericEnvClient(base_url=url, message_timeout_s=REMOTE_MESSAGE_TIMEOUT_S)
        # One message at a time: the client reads the answer to what it sent next off the socket.
        self.turn = asyncio.Lock()

    async def reset(self, arguments: dict[str, Any]) -> _Step:
        await self.client.connect()
        return self._step(await self.client.reset(**arguments))

    async def step(self, action: BaseModel | dict[str, Any]) -> _Step:
        payload = action if isinstance(action, dict) else action.model_dump(mode="json")
        async with self.turn:
            return self._step(await self.client.step(payload))

    @staticmethod
    def _step(result: Any) -> _Step:
        return _Step(dict(result.observation), result.reward, result.done)

    async def close(self) -> None:
        await self.client.disconnect()


def _accepted(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The `arguments` that `fn` takes (all of them if it takes **kwargs), as OpenEnv's server passes them."""
    parameters = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return dict(arguments)
    return {key: value for key, value in arguments.items() if key in parameters}


# --- the environment -------------------------------------------------------------

class _OpenEnvEnvironment(GeneratedEnvironment):
    """One OpenEnv session per episode; the generated subclasses add the tools."""

    #: The class's tools: (name, description, input schema, is an MCP tool).
    tool_table: tuple[tuple[str, str, Any, bool], ...] = ()
    #: Whether episodes of this class may overlap in one process (OpenEnv's SUPPORTS_CONCURRENT_SESSIONS).
    concurrent_sessions = True
    #: Makes the episode's session (set on each generated class).
    new_session: Callable[[], _Session]
    #: Where episodes take turns when they may not overlap, per event loop.
    _turns: dict[Any, asyncio.Lock] = {}

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        if not isinstance(task_spec, dict):
            raise ValueError("an OpenEnv task spec is an object: reset's keyword arguments")
        self._session: _Session | None = None
        self._prompt: list[TextBlock | ImageBlock] = []
        self._holds_turn = False

    @classmethod
    def task(cls, index: int, size: int, seed: int) -> JSONObject:
        return {"seed": seed + index}

    @classmethod
    @functools.cache
    def list_tools(cls) -> ListToolsOutput:
        # The tools' own schemas (an MCP tool's input is checked by the tool, not by a model here).
        listed = super().list_tools()
        return listed.model_copy(update={"tools": [ToolSpec(name=name, description=description, input_schema=schema)
                                                   for name, description, schema, _ in cls.tool_table]})

    async def setup(self) -> None:
        if not self.concurrent_sessions:
            await self._turn().acquire()
            self._holds_turn = True
        try:
            self._session = type(self).new_session()
            first = await self._session.reset(dict(self.task_spec))
        except BaseException:
            await self.teardown()
            raise
        self._prompt = observation_blocks(first.fields)

    async def teardown(self) -> None:
        session, self._session = self._session, None
        try:
            if session is not None:
                await session.close()
        finally:
            if self._holds_turn:
                self._holds_turn = False
                self._turn().release()

    @classmethod
    def _turn(cls) -> asyncio.Lock:
        key = (cls, asyncio.get_running_loop())
        if key not in cls._turns:
            cls._turns[key] = asyncio.Lock()
        return cls._turns[key]

    def get_prompt(self) -> list[TextBlock | ImageBlock]:
        return self._prompt

    async def _act(self, action: BaseModel | dict[str, Any], mcp_tool: bool) -> ToolOutput:
        if self._session is None:
            raise RuntimeError("the OpenEnv session has ended")
        return (await self._session.step(action)).output(mcp_tool)


def _step_tool(action_class: type[BaseModel]) -> Callable[..., Awaitable[ToolOutput]]:
    async def step(self: _OpenEnvEnvironment, args: BaseModel) -> ToolOutput:
        return await self._act(args, mcp_tool=False)

    step.__annotations__ = {"args": action_class, "return": ToolOutput}
    return tool(step)


def _mcp_tool(name: str) -> Callable[..., Awaitable[ToolOutput]]:
    async def call(self: _OpenEnvEnvironment, args: _Arguments) -> ToolOutput:
        return await self._act({"tool_name": name, "arguments": args.model_dump(mode="json"), "type": "call_tool"},
                               mcp_tool=True)

    call.__annotations__ = {"args": _Arguments, "return": ToolOutput}
    call.__name__ = name
    return tool(call)


# --- building the classes ----------------------------------------------------------

@functools.cache
def _environment_class(recipe_json: str) -> type[Environment]:
    recipe = json.loads(recipe_json)
    attributes = _hosted(recipe) if recipe["kind"] == "class" else _fronted(recipe)
    table = attributes["tool_table"]
    clashes = sorted(name for name, *_ in table if name != STEP_TOOL and hasattr(_OpenEnvEnvironment, name))
    if clashes:
        raise ValueError(f"{recipe['target']}: tools named like ORS environment methods cannot be served: {clashes}")
    for name, _, _, is_mcp in table:
        attributes[name] = _mcp_tool(name) if is_mcp else _step_tool(attributes["action_class"])
    return generated_class(_OpenEnvEnvironment, recipe, __name__, f"OpenEnv: {recipe['target']}",
                           name=attributes.pop("env_name"), **attributes)


def _hosted(recipe: dict[str, Any]) -> dict[str, Any]:
    """What a generated class hosting an OpenEnv class in this process holds."""
    env_class = _load(recipe["target"])
    if not (isinstance(env_class, type) and issubclass(env_class, OpenEnvEnvironment)):
        raise ValueError(f"{recipe['target']} is not an OpenEnv Environment class")
    single_thread = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"openenv-{env_class.__name__}")
                     if env_class.REQUIRES_SINGLE_THREAD_EXECUTOR else None)
    attributes: dict[str, Any] = {"env_name": recipe["name"] or env_class.__name__,
                                  "concurrent_sessions": bool(env_class.SUPPORTS_CONCURRENT_SESSIONS)}
    if issubclass(env_class, MCPEnvironment):
        probe = env_class()
        try:
            listed = probe.step(ListToolsAction())
        finally:
            probe.close()
        if listed.metadata.get("error"):
            raise ValueError(f"{recipe['target']}: listing its MCP tools failed: {listed.metadata['error']}")
        attributes["tool_table"] = tuple((t.name, t.description, t.input_schema, True) for t in listed.tools)
    else:
        action_class = _load(recipe["action"]) if recipe["action"] else _action_class(env_class)
        attributes["tool_table"] = ((STEP_TOOL, _step_description(env_class, action_class),
                                     action_class.model_json_schema(), False),)
        attributes["action_class"] = action_class
    attributes["new_session"] = staticmethod(lambda: _LocalSession(env_class, single_thread))
    return attributes


def _fronted(recipe: dict[str, Any]) -> dict[str, Any]:
    """What a generated class fronting a running OpenEnv server holds: its tools as it
    lists them (MCP tools, else `step` with its action schema), read once now."""
    url = recipe["target"]
    http = _http_url(url)
    metadata = _get_json(f"{http}/metadata")
    name = recipe["name"] or metadata.get("name") or urllib.parse.urlsplit(url).hostname
    listed = run_async_safely(_remote_mcp_tools(url))
    attributes: dict[str, Any] = {"env_name": name, "new_session": staticmethod(lambda: _RemoteSession(url))}
    if listed is not None:
        attributes["tool_table"] = tuple((t["name"], t.get("description") or "", t.get("input_schema") or {}, True)
                                         for t in listed)
    else:
        schema = _get_json(f"{http}/schema")["action"]
        attributes["tool_table"] = ((STEP_TOOL, schema.get("description") or f"Take one step of {name}.",
                                     schema, False),)
        attributes["action_class"] = _checked_against(schema)
    return attributes


async def _remote_mcp_tools(url: str) -> list[dict[str, Any]] | None:
    """The MCP tools of a server's environment, or None when it takes no MCP actions."""
    client = GenericEnvClient(base_url=url, message_timeout_s=REMOTE_MESSAGE_TIMEOUT_S)
    try:
        result = await client.step({"type": "list_tools"})
    except RuntimeError:  # the server's error answer: its action type is not an MCP one
        return None
    finally:
        await client.disconnect()
    tools = result.observation.get("tools")
    return tools if isinstance(tools, list) else None


def _http_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urllib.parse.urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=REMOTE_MESSAGE_TIMEOUT_S) as response:
        return json.load(response)


def _action_class(env_class: type) -> type[Action]:
    """The action type of an Environment class: its `step`'s annotation, else its generic parameter."""
    hints = typing.get_type_hints(env_class.step)
    annotated = hints.get("action")
    if isinstance(annotated, type) and issubclass(annotated, Action) and annotated is not Action:
        return annotated
    for klass in env_class.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is OpenEnvEnvironment:
                argument = typing.get_args(base)[0]
                if isinstance(argument, type) and issubclass(argument, Action):
                    return argument
    raise ValueError(f"cannot tell the action type of {env_class.__qualname__}: name it (action=MODULE:CLASS)")


def _step_description(env_class: type, action_class: type) -> str:
    doc = inspect.getdoc(action_class)
    if doc and doc != inspect.getdoc(Action):
        return doc
    return f"Take one step of {env_class.__name__}."


def _import_path(target: type | str) -> str:
    if isinstance(target, str):
        return target
    return f"{target.__module__}:{target.__qualname__}"


def _load(path: str) -> Any:
    module_name, sep, qualname = path.partition(":")
    if not sep:
        raise ValueError(f"expected MODULE:CLASS, got {path!r}")
    if "" not in sys.path:  # the current directory is importable, as for `serve MODULE:CLASS`
        sys.path.insert(0, "")
    found: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found
