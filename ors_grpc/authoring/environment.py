"""The `Environment` base class and the `@tool` and `@terminal` decorators.

Same surface and defaults as the reference SDKs, so an environment written
for `ors` (ors-sdk 0.1.0) or `openreward.environments` (openreward >= 0.1.157)
runs here after changing only its import. openreward's additions are
options an ors-sdk environment simply does not use: `tool(concurrent=,
exclusive=)`, `@terminal`, `get_messages`, `score_group`. How calls take
turns (per-tool locks, the exclusive gate) is the service's business
(`tool_calls`); the flags live on the tool functions. One
difference, invisible to authors: synchronous user code (constructors,
`setup`, `teardown`, `get_prompt`, tools) that turns out to be slow runs in a
worker thread, so a slow episode does not stall the event loop that serves
every other session (see `user_code`; an episode's own sync code still runs
one call at a time, as under the reference).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
from abc import ABC, abstractmethod
from typing import (
    Any,
    Awaitable,
    Callable,
    ClassVar,
    Optional,
    Sequence,
    Union,
    get_type_hints,
    overload,
)

from pydantic import BaseModel, ValidationError

from ors_grpc.authoring.types import (
    SUPPORTED_MESSAGE_BLOCK_TYPES,
    Blocks,
    GroupCandidate,
    GroupScore,
    ImageBlock,
    JSONObject,
    ListToolsOutput,
    Message,
    ReasoningBlock,
    RunToolError,
    RunToolOutput,
    RunToolSuccess,
    Split,
    TerminalToolSpec,
    TextBlock,
    ToolCallBlock,
    ToolOutput,
    ToolResultBlock,
    ToolSpec,
)
from ors_grpc._runtime.user_code import run_user_code

__all__ = [
    "Environment",
    "ToolSignatureError",
    "class_has_exclusive_tools",
    "find_terminal_tool",
    "flatten_messages",
    "is_concurrent_tool",
    "is_exclusive_tool",
    "terminal",
    "tool",
    "tool_specs_of",
]

logger = logging.getLogger("ors_grpc.environment")


@overload
def tool(fn: Callable[..., Any]) -> Callable[..., Any]: ...
@overload
def tool(
    *, shared: bool = True, concurrent: bool = False, exclusive: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
def tool(
    fn: Optional[Callable[..., Any]] = None,
    *,
    shared: bool = True,
    concurrent: bool = False,
    exclusive: bool = False,
) -> Callable[..., Any]:
    """Mark a method as a tool: `@tool`, or `@tool(...)` with options.

    `shared=False`: `list_tools` does not advertise it (a task-specific tool).
    Calls to one tool in a session take turns, so parallel calls cannot race
    a grader. `concurrent=True` skips that (read-only tools that never grant
    reward). `exclusive=True` (a `submit` that ends the episode): the call
    waits for every call in flight in the session and holds new ones off
    until it returns, so nothing changes the state it grades.
    """

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        setattr(f, "_env_tool", True)
        setattr(f, "_env_tool_shared", shared)
        setattr(f, "_env_tool_concurrent", concurrent)
        setattr(f, "_env_tool_exclusive", exclusive)
        return f

    return mark if fn is None else mark(fn)


def terminal(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a `@tool` as the environment's terminal tool (above or below `@tool`).

    It is left out of the tool list the agent sees; a harness sends the
    agent's final plain message to it instead (`call_terminal_tool`). It takes
    a pydantic model with one field (which receives the message) or nothing,
    and always runs exclusively. An environment and its toolsets have at most
    one; `list_tools` enforces these rules.
    """
    setattr(fn, "_env_tool_terminal", True)
    return fn


def is_exclusive_tool(fn: Callable[..., Any]) -> bool:
    """Whether calls to `fn` run alone in their session (exclusive or terminal)."""
    return bool(getattr(fn, "_env_tool_exclusive", False) or getattr(fn, "_env_tool_terminal", False))


def is_concurrent_tool(fn: Callable[..., Any]) -> bool:
    """Whether calls to `fn` skip its per-tool lock (an exclusive tool never does)."""
    return bool(getattr(fn, "_env_tool_concurrent", False)) and not is_exclusive_tool(fn)


def _introspect_tool(fn: Callable[..., Any]) -> tuple[Any, dict, list]:
    """Return (unwrapped_fn, type_hints, non-self params) for a tool function.

    Cached per underlying function: every tool call looks its tool up, and
    `get_type_hints` plus `inspect.signature` cost more than a small tool.
    The result is shared: callers must not modify it.
    """
    func = getattr(fn, "__func__", None)
    try:
        return _introspect_function(fn, False) if func is None else _introspect_function(func, True)
    except TypeError:  # an unhashable callable: not cached
        return _introspect_function.__wrapped__(fn, False)


@functools.lru_cache(maxsize=1024)
def _introspect_function(func: Callable[..., Any], bound: bool) -> tuple[Any, dict, list]:
    real = inspect.unwrap(func)
    hints = get_type_hints(real, include_extras=True)
    params = list(inspect.signature(real).parameters.values())
    if bound and real is func:
        # What inspect.signature(<bound method>) leaves out: the first parameter.
        params = params[1:]
    return real, hints, [p for p in params if p.name != "self"]


class ToolSignatureError(TypeError):
    """A @tool method whose signature cannot work (the reference SDK drops such a method without a word)."""


TOOL_SIGNATURE_RULE = "a @tool takes no argument or one pydantic BaseModel and is annotated `-> ToolOutput`"


def _tool_signature_problem(fn: Callable[..., Any]) -> str | None:
    """What is wrong with a @tool's signature (see TOOL_SIGNATURE_RULE), or None."""
    try:
        _, hints, params = _introspect_tool(fn)
    except Exception as exc:  # get_type_hints: a name in an annotation that does not resolve
        return f"its annotations cannot be resolved ({type(exc).__name__}: {exc})"
    if "return" not in hints:
        return "it has no return annotation"
    if hints["return"] != ToolOutput:
        return f"it is annotated `-> {_annotation_name(hints['return'])}`"
    if len(params) > 1:
        return f"it takes {len(params)} arguments ({', '.join(p.name for p in params)})"
    if params:
        param = params[0]
        # The input model is passed positionally (as under the reference).
        if param.kind in (param.VAR_KEYWORD, param.KEYWORD_ONLY):
            stars = "**" if param.kind is param.VAR_KEYWORD else ""
            return f"its argument `{stars}{param.name}` cannot be passed positionally"
        annotation = hints.get(param.name)
        if annotation is None:
            return f"its argument `{param.name}` has no annotation"
        if not (inspect.isclass(annotation) and issubclass(annotation, BaseModel)):
            return f"its argument `{param.name}` is a `{_annotation_name(annotation)}`, not a pydantic BaseModel"
    return None


def _annotation_name(annotation: Any) -> str:
    return annotation.__name__ if inspect.isclass(annotation) else str(annotation)


def _check_tool_signatures(owner: type) -> None:
    """Raise ToolSignatureError for the first @tool of `owner` (an environment or a toolset) that cannot work."""
    for name in dir(owner):
        fn = getattr(owner, name, None)
        if callable(fn) and getattr(fn, "_env_tool", False):
            problem = _tool_signature_problem(fn)
            if problem is not None:
                raise ToolSignatureError(f"tool {owner.__name__}.{name}: {problem}; {TOOL_SIGNATURE_RULE}")


def _tool_spec(name: str, fn: Callable[..., Any]) -> ToolSpec:
    _, hints, params = _introspect_tool(fn)
    schema = None
    if params:
        model: type[BaseModel] = hints[params[0].name]
        schema = model.model_json_schema()
    return ToolSpec(name=name, description=(fn.__doc__ or "").strip(), input_schema=schema)


def _terminal_arg(name: str, fn: Callable[..., Any]) -> Optional[str]:
    """The one input field of a terminal tool (it receives the message), or
    None for a tool without input."""
    _, hints, params = _introspect_tool(fn)
    if not params:
        return None
    model = hints.get(params[0].name)
    fields = list(getattr(model, "model_fields", {}) or {})
    if len(fields) > 1:
        raise ValueError(
            f"Terminal tool {name!r} must accept at most one argument (the message), "
            f"but its input model {getattr(model, '__name__', model)!r} declares "
            f"{len(fields)} fields: {fields}."
        )
    return fields[0] if fields else None


def find_terminal_tool(owner: Any, found: Optional[TerminalToolSpec] = None) -> Optional[TerminalToolSpec]:
    """The `@terminal` tool of a class or instance (`found`: one already seen
    on another owner, so that a second one is an error), checked."""
    for name in dir(owner):
        fn = getattr(owner, name, None)
        if fn is None or not getattr(fn, "_env_tool_terminal", False):
            continue
        if not getattr(fn, "_env_tool", False):
            raise ValueError(f"@terminal tool {name!r} is missing @tool: add @tool to it.")
        if not Environment._is_tool(fn):
            raise ValueError(
                f"@terminal tool {name!r} is not a valid tool. It must take a single "
                f"Pydantic model argument (or none) and return ToolOutput."
            )
        if getattr(fn, "_env_tool_concurrent", False):
            raise ValueError(
                f"@terminal tool {name!r} is marked concurrent=True. A terminal "
                f"tool grades the episode, so it must run serialised."
            )
        if found is not None:
            raise ValueError(
                f"Multiple @terminal tools defined: {found.name!r} and {name!r}. "
                f"An environment may have at most one terminal tool."
            )
        found = TerminalToolSpec(name=name, arg=_terminal_arg(name, fn), description=(fn.__doc__ or "").strip())
    return found


def _as_text_block(block: Any) -> list[Union[TextBlock, ImageBlock]]:
    """One message block as prompt blocks: rich blocks become text."""
    if isinstance(block, ReasoningBlock):
        return [TextBlock(text=f"<think>{block.text}</think>", detail={"type": "reasoning"})]
    if isinstance(block, ToolCallBlock):
        arguments = json.dumps(dict(block.input))
        return [TextBlock(text=f"[tool_call {block.name}] {arguments}", detail={"type": "tool_call", "id": block.id})]
    if isinstance(block, ToolResultBlock):
        label = "[tool_result (error)]" if block.is_error else "[tool_result]"
        return [TextBlock(text=label, detail={"type": "tool_result", "tool_call_id": block.tool_call_id}),
                *block.blocks]
    return [block]


def flatten_messages(messages: Sequence[Message]) -> list[Union[TextBlock, ImageBlock]]:
    """A conversation as prompt blocks, for an environment that implements
    only `get_messages` (as openreward renders it). One user message of text
    and images is its blocks as they are; otherwise each message opens with
    a `[role]` text block and rich blocks are rendered as text."""
    messages = list(messages)
    if len(messages) == 1 and messages[0].role == "user" and all(
        isinstance(block, (TextBlock, ImageBlock)) for block in messages[0].blocks
    ):
        return list(messages[0].blocks)
    blocks: list[Union[TextBlock, ImageBlock]] = []
    for message in messages:
        blocks.append(TextBlock(text=f"[{message.role}]", detail={"role": message.role}))
        for block in message.blocks:
            blocks.extend(_as_text_block(block))
    return blocks


@functools.lru_cache(maxsize=1024)
def class_has_exclusive_tools(owner: type) -> bool:
    """Whether any tool of a class (an environment with its declared
    toolsets, or a toolset) runs exclusively: its sessions need the gate."""
    owners = (owner, *getattr(owner, "toolsets", ()))
    return any(
        is_exclusive_tool(fn) and Environment._is_tool(fn)
        for cls in owners
        for fn in (getattr(cls, name, None) for name in dir(cls))
        if fn is not None
    )


def tool_specs_of(owner: Any) -> list[ToolSpec]:
    """The shared tools of an object (a session's toolset instance), by name."""
    specs = []
    for name in dir(owner):
        fn = getattr(owner, name, None)
        if fn is not None and Environment._is_tool(fn) and getattr(fn, "_env_tool_shared", True):
            specs.append(_tool_spec(name, fn))
    return specs


def _input_model(fn: Callable[..., Any]) -> Optional[type[BaseModel]]:
    _, hints, params = _introspect_tool(fn)
    return hints[params[0].name] if params else None


class Environment(ABC):
    """An interface to (possibly stateful) computation an agent acts on with tools.

    Environments have tasks: JSON objects describing a setup and goal. One
    instance serves one episode, constructed from its task spec and secrets.
    """

    toolsets: ClassVar[Sequence[type]] = ()
    #: Where this environment's synchronous code (constructor, setup, prompt,
    #: tools, task listing, teardown) runs. None (the default): each function
    #: starts in a worker thread and moves to the event loop once its calls
    #: prove quick (8 in a row within 2 ms each); a call over 2 ms on the
    #: loop sends it back to threads, for a trial twice as long (see
    #: `user_code`). True: always on the loop, as the reference
    #: SDK runs it (no thread round trip, but a slow call stalls every
    #: session). False: always in a worker thread (set it when sync code
    #: that is usually quick may block, e.g. waits on something the loop must
    #: do). Async code always runs on the loop.
    sync_code_on_loop: ClassVar[Optional[bool]] = None

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        self.task_spec = task_spec
        self._toolset_instances: dict[type, Any] = {}

    def setup(self) -> Optional[Awaitable[None]]:
        """Prepare the episode; runs in the background after creation."""

    def teardown(self) -> Optional[Awaitable[None]]:
        """Release the episode's resources; runs when the episode ends."""

    def get_prompt(self) -> Union[Blocks, Awaitable[Blocks]]:
        """The prompt for the current task. An environment implements this or
        `get_messages` (or both); by default it is `get_messages` flattened."""
        return self._default_prompt()

    async def _default_prompt(self) -> Blocks:
        if not self._overrides("get_messages"):
            raise NotImplementedError(f"{type(self).__name__} must implement get_prompt() or get_messages().")
        return flatten_messages(await run_user_code(self.get_messages, on_loop=self.sync_code_on_loop))

    def get_messages(self) -> Union[Sequence[Message], Awaitable[Sequence[Message]]]:
        """The prompt as a role-tagged conversation; by default `get_prompt`'s
        blocks as one user message."""
        return self._default_messages()

    async def _default_messages(self) -> list[Message]:
        if not self._overrides("get_prompt"):
            raise NotImplementedError(f"{type(self).__name__} must implement get_prompt() or get_messages().")
        blocks = await run_user_code(self.get_prompt, on_loop=self.sync_code_on_loop)
        return [Message(role="user", blocks=blocks)]

    @classmethod
    def _overrides(cls, hook: str) -> bool:
        """Whether this class replaces the base class's `hook` (a method name)."""
        return getattr(cls, hook) is not getattr(Environment, hook)

    async def score_group(self, candidates: Sequence[GroupCandidate]) -> Sequence[Union[GroupScore, float]]:
        """Score a group of candidate completions of this episode's task: one
        score per candidate, in order (bare floats become `GroupScore`s).
        Optional: implement it to support group scoring."""
        raise NotImplementedError(f"{type(self).__name__} does not implement score_group().")

    @classmethod
    def _supports_score_group(cls) -> bool:
        return cls._overrides("score_group")

    @classmethod
    @abstractmethod
    def list_tasks(cls, split: str) -> Union[Sequence[JSONObject], Awaitable[Sequence[JSONObject]]]:
        """All tasks of a split."""

    @classmethod
    @abstractmethod
    @functools.cache
    def list_splits(cls) -> Sequence[Union[Split, str]]:
        """The environment's splits: `Split` objects or bare names."""

    @classmethod
    async def num_tasks(cls, split: str) -> int:
        """The number of tasks of a split (cached per class and split)."""
        cache: dict[str, int] | None = cls.__dict__.get("_num_tasks_cache")
        if cache is None:
            cache = cls._num_tasks_cache = {}
        if split not in cache:
            cache[split] = len(await run_user_code(cls.list_tasks, split, on_loop=cls.sync_code_on_loop))
        return cache[split]

    @classmethod
    async def get_task(cls, split: str, index: int) -> JSONObject:
        """Task `index` of a split; by default lists the split and indexes it."""
        tasks = await run_user_code(cls.list_tasks, split, on_loop=cls.sync_code_on_loop)
        return tasks[index]

    @classmethod
    async def get_task_range(
        cls, split: str, start: Optional[int] = None, stop: Optional[int] = None
    ) -> list[JSONObject]:
        """Tasks in [start, stop) of a split, with Python slice conventions."""
        total = await cls.num_tasks(split)
        start = 0 if start is None else start
        stop = total if stop is None else stop
        if start < 0:
            start = max(total + start, 0)
        if stop < 0:
            stop = max(total + stop, 0)
        start, stop = min(start, total), min(stop, total)
        return [await cls.get_task(split, i) for i in range(start, stop)]

    @staticmethod
    def _is_tool(fn: Callable[..., Any]) -> bool:
        """A tool is marked with @tool, returns ToolOutput and takes nothing
        or one pydantic model."""
        if not callable(fn) or not getattr(fn, "_env_tool", False):
            return False
        _, hints, params = _introspect_tool(fn)
        if hints.get("return") != ToolOutput:
            return False
        if len(params) == 0:
            return True
        if len(params) == 1:
            param_type = hints.get(params[0].name)
            return inspect.isclass(param_type) and issubclass(param_type, BaseModel)
        return False

    @classmethod
    @functools.cache
    def list_tools(cls) -> ListToolsOutput:
        """The shared tools of this class and its toolsets (cached per class),
        the terminal tool apart.

        A @tool whose signature cannot work (shared or not) raises
        ToolSignatureError, naming the method and the rule it breaks."""
        for owner in (cls, *cls.toolsets):
            _check_tool_signatures(owner)
        terminal_tool = find_terminal_tool(cls)
        for toolset_cls in cls.toolsets:
            terminal_tool = find_terminal_tool(toolset_cls, terminal_tool)
        hidden = terminal_tool.name if terminal_tool is not None else None
        out: list[ToolSpec] = []
        env_tool_names: set[str] = set()
        for name in dir(cls):
            fn = getattr(cls, name)
            if cls._is_tool(fn) and getattr(fn, "_env_tool_shared", True) and name != hidden:
                out.append(_tool_spec(name, fn))
                env_tool_names.add(name)
        for toolset_cls in cls.toolsets:
            for name in dir(toolset_cls):
                fn = getattr(toolset_cls, name)
                if not cls._is_tool(fn) or not getattr(fn, "_env_tool_shared", True) or name == hidden:
                    continue
                if name in env_tool_names:
                    raise ValueError(
                        f"Tool name collision: '{name}' is defined in both the environment "
                        f"and toolset '{toolset_cls.__name__}'. Please rename one of them to avoid conflicts."
                    )
                out.append(_tool_spec(name, fn))
        return ListToolsOutput(
            tools=out,
            terminal_tool=terminal_tool,
            supports_score_group=cls._supports_score_group(),
            message_block_types=list(SUPPORTED_MESSAGE_BLOCK_TYPES),
        )

    @classmethod
    def terminal_tool(cls) -> Optional[TerminalToolSpec]:
        """The environment's `@terminal` tool, or None."""
        return cls.list_tools().terminal_tool

    @classmethod
    def is_assistant_message_final(cls) -> bool:
        """True when a plain assistant message ends the rollout (the
        environment has a terminal tool to send it to)."""
        return cls.terminal_tool() is not None

    async def call_terminal_tool(self, message: str = "") -> RunToolOutput:
        """Call the terminal tool with `message` as its one input field (a
        terminal tool without input is called with none)."""
        spec = self.terminal_tool()
        if spec is None:
            raise ValueError(
                f"Environment {self.name()!r} has no @terminal tool; "
                f"nothing to invoke. Decorate a tool with @terminal first."
            )
        return await self._call_tool(spec.name, {} if spec.arg is None else {spec.arg: message})

    def list_task_tools(self) -> ListToolsOutput:
        """Tools specific to this episode's task; none by default."""
        return ListToolsOutput(tools=[])

    def _toolset_instance(self, toolset_cls: type) -> Any | None:
        if toolset_cls not in self._toolset_instances:
            try:
                self._toolset_instances[toolset_cls] = toolset_cls(self)
            except TypeError:
                try:
                    self._toolset_instances[toolset_cls] = toolset_cls()
                except Exception as exc:
                    logger.error("toolset_instantiation_failed toolset=%s error=%s", toolset_cls.__name__, exc)
                    return None
        return self._toolset_instances[toolset_cls]

    def _find_toolset_tool(self, name: str) -> tuple[Callable[..., Any] | None, str | None]:
        for toolset_cls in self.__class__.toolsets:
            instance = self._toolset_instance(toolset_cls)
            candidate = getattr(instance, name, None) if instance is not None else None
            if candidate is not None and self._is_tool(candidate):
                return candidate, toolset_cls.__name__
        return None, None

    def _resolve_tool(
        self, name: str, session_toolset: Any = None
    ) -> Union[Callable[..., Any], RunToolOutput]:
        """The function of tool `name`, or the refusal (not_found,
        name_collision). A session's toolset comes first: its tools replace
        same-named ones of the environment."""
        if session_toolset is not None:
            session_fn = getattr(session_toolset, name, None)
            if session_fn is not None and self._is_tool(session_fn):
                return session_fn
        env_fn = getattr(self, name, None)
        has_env_tool = env_fn is not None and self._is_tool(env_fn)
        toolset_fn, toolset_source = self._find_toolset_tool(name)
        if has_env_tool and toolset_fn is not None:
            return RunToolOutput(RunToolError(
                error=f"Tool name collision: '{name}' is defined in both the environment "
                f"and toolset '{toolset_source}'. Please rename one of them to avoid conflicts.",
                reason="name_collision",
            ))
        fn = env_fn if has_env_tool else toolset_fn
        if fn is None:
            return RunToolOutput(RunToolError(error=f"{name!r} is not a valid tool", reason="not_found"))
        return fn

    async def _run_tool_fn(
        self, name: str, fn: Callable[..., Any], input: JSONObject, *, sync_lock: asyncio.Lock | None = None
    ) -> RunToolOutput:
        """Validate `input` for tool function `fn` and run it; invalid input
        is a refusal (input_validation), exceptions of the tool propagate."""
        model = _input_model(fn)
        if model is not None:
            try:
                arg = model(**input)
            except ValidationError as exc:
                return RunToolOutput(RunToolError(
                    error=f"Tool input validation error: {str(exc.errors())}", reason="input_validation"
                ))
            result = await run_user_code(fn, arg, sync_lock=sync_lock, on_loop=self.sync_code_on_loop)
        else:
            result = await run_user_code(fn, sync_lock=sync_lock, on_loop=self.sync_code_on_loop)
        if not isinstance(result, ToolOutput):
            raise TypeError(f"{name!r} returned {type(result).__name__}; expected ToolOutput")
        return RunToolOutput(RunToolSuccess(output=result))

    async def _call_tool(
        self, name: str, input: JSONObject, *, sync_lock: asyncio.Lock | None = None
    ) -> RunToolOutput:
        """Run tool `name` on `input` at once (no turn-taking: the service's
        `tool_calls` adds that); unknown names and invalid input are
        tool-level errors, exceptions of the tool propagate. `sync_lock`: see
        `run_user_code`."""
        fn = self._resolve_tool(name)
        if isinstance(fn, RunToolOutput):
            return fn
        return await self._run_tool_fn(name, fn, input, sync_lock=sync_lock)

    @classmethod
    def name(cls) -> str:
        return cls.__name__
