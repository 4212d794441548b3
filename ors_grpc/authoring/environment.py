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
user-code thread, so a slow episode does not stall the event loop that serves
every other session (see `user_code`; an episode's own sync code still runs
one call at a time, as under the reference).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
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
from ors_grpc.protocol.validation import describe_validation_error

__all__ = [
    "Environment",
    "ToolSignatureError",
    "ToolMarks",
    "class_has_exclusive_tools",
    "find_terminal_tool",
    "flatten_messages",
    "marks_of",
    "not_a_tool",
    "overrides",
    "resolve_tool",
    "task_slice",
    "terminal",
    "tool",
    "tool_argument",
    "tool_marks",
    "tool_result",
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


@dataclass(frozen=True)
class ToolMarks:
    """What the server needs to know of a tool to schedule its calls, as its
    decorators marked it (`tool(concurrent=, exclusive=)`, `@terminal`)."""

    #: Calls run alone in their session: `exclusive=True`, or a terminal tool.
    exclusive: bool = False
    #: Calls skip the tool's per-call turn (`concurrent=True`); never an exclusive tool's.
    concurrent: bool = False
    #: The environment's `@terminal` tool.
    terminal: bool = False


# The eight possible marks, made once: reading a tool's marks is on every call's path.
_MARKS = {
    (exclusive, concurrent, terminal): ToolMarks(exclusive or terminal, concurrent and not (exclusive or terminal),
                                                 terminal)
    for exclusive in (False, True) for concurrent in (False, True) for terminal in (False, True)
}


def marks_of(fn: Callable[..., Any]) -> ToolMarks:
    """The marks of a tool function (none for a function that is not a tool)."""
    return _MARKS[(bool(getattr(fn, "_env_tool_exclusive", False)), bool(getattr(fn, "_env_tool_concurrent", False)),
                   bool(getattr(fn, "_env_tool_terminal", False)))]


def tool_marks(env: Any, name: str, session_toolset: Any = None) -> Optional[ToolMarks]:
    """The marks of tool `name` of an environment (a class or an instance),
    read where `resolve_tool` would find it (the session's toolset, then the
    environment, then the toolsets it declares) without building anything;
    None when none of them declares such a tool."""
    if inspect.isclass(env) and (session_toolset is None or inspect.isclass(session_toolset)):
        return _class_tool_marks(env, name, session_toolset)  # classes' tools are fixed: read once
    return _tool_marks(env, name, session_toolset)


def _tool_marks(env: Any, name: str, session_toolset: Any) -> Optional[ToolMarks]:
    cls = env if inspect.isclass(env) else type(env)
    for owner in (session_toolset, env, *cls.toolsets):
        fn = getattr(owner, name, None) if owner is not None else None
        if fn is not None and Environment._is_tool(fn):
            return marks_of(fn)
    return None


_class_tool_marks = functools.lru_cache(maxsize=4096)(_tool_marks)


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
        marks_of(fn).exclusive and Environment._is_tool(fn)
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
    #: starts in a user-code thread and moves to the event loop once its calls
    #: prove quick (8 in a row within 2 ms each); a call over 2 ms on the
    #: loop sends it back to threads, for a trial twice as long (see
    #: `user_code`). True: always on the loop, as the reference
    #: SDK runs it (no thread round trip, but a slow call stalls every
    #: session). False: always in a user-code thread (set it when sync code
    #: that is usually quick may block, e.g. waits on something the loop must
    #: do). Async code always runs on the loop.
    sync_code_on_loop: ClassVar[Optional[bool]] = None

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        self.task_spec = task_spec

    def setup(self) -> Optional[Awaitable[None]]:
        """Prepare the episode; runs in the background after creation."""

    def teardown(self) -> Optional[Awaitable[None]]:
        """Release the episode's resources; runs when the episode ends."""

    def get_prompt(self) -> Union[Blocks, Awaitable[Blocks]]:
        """The prompt for the current task. An environment implements this or
        `get_messages` (or both); by default it is `get_messages` flattened."""
        return self._default_prompt()

    async def _default_prompt(self) -> Blocks:
        if not overrides(self, "get_messages"):
            raise NotImplementedError(f"{type(self).__name__} must implement get_prompt() or get_messages().")
        return flatten_messages(await _awaited(self.get_messages()))

    def get_messages(self) -> Union[Sequence[Message], Awaitable[Sequence[Message]]]:
        """The prompt as a role-tagged conversation; by default `get_prompt`'s
        blocks as one user message."""
        return self._default_messages()

    async def _default_messages(self) -> list[Message]:
        if not overrides(self, "get_prompt"):
            raise NotImplementedError(f"{type(self).__name__} must implement get_prompt() or get_messages().")
        return [Message(role="user", blocks=await _awaited(self.get_prompt()))]

    async def score_group(self, candidates: Sequence[GroupCandidate]) -> Sequence[Union[GroupScore, float]]:
        """Score a group of candidate completions of this episode's task: one
        score per candidate, in order (bare floats become `GroupScore`s).
        Optional: implement it to support group scoring."""
        raise NotImplementedError(f"{type(self).__name__} does not implement score_group().")

    @classmethod
    @abstractmethod
    def list_tasks(cls, split: str) -> Union[Sequence[JSONObject], Awaitable[Sequence[JSONObject]]]:
        """All tasks of a split."""

    @classmethod
    @abstractmethod
    def list_splits(cls) -> Sequence[Union[Split, str]]:
        """The environment's splits: `Split` objects or bare names."""

    # The server runs the three below through its own runner when a class
    # keeps them (the runtime's catalog host, `local_hosts`), so that a slow
    # synchronous `list_tasks` never stalls its event loop.

    @classmethod
    async def num_tasks(cls, split: str) -> int:
        """The number of tasks of a split; by default the length of its listing."""
        return len(await _awaited(cls.list_tasks(split)))

    @classmethod
    async def get_task(cls, split: str, index: int) -> JSONObject:
        """Task `index` of a split; by default lists the split and indexes it."""
        return (await _awaited(cls.list_tasks(split)))[index]

    @classmethod
    async def get_task_range(
        cls, split: str, start: Optional[int] = None, stop: Optional[int] = None
    ) -> list[JSONObject]:
        """Tasks in [start, stop) of a split, with Python slice conventions."""
        return [await cls.get_task(split, i) for i in task_slice(await cls.num_tasks(split), start, stop)]

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
            supports_score_group=overrides(cls, "score_group"),
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

    async def _call_tool(self, name: str, input: JSONObject) -> RunToolOutput:
        """Run tool `name` on `input` at once, in the caller's thread (the
        server's `tool_calls` adds turn-taking and its runner); unknown names
        and invalid input are tool-level errors, exceptions of the tool
        propagate."""
        fn = resolve_tool(self, name)
        if isinstance(fn, RunToolOutput):
            return fn
        args = tool_argument(fn, input)
        if isinstance(args, RunToolOutput):
            return args
        return tool_result(name, await _awaited(fn(*args)))

    @classmethod
    def name(cls) -> str:
        return cls.__name__


async def _awaited(value: Any) -> Any:
    """`value`, awaited if it is awaitable (user code may be sync or async)."""
    return await value if inspect.isawaitable(value) else value


def overrides(env: Any, hook: str) -> bool:
    """Whether an environment (a class or an instance) replaces the base
    class's `hook` (a method name); an instance may also set it on itself."""
    cls = env if inspect.isclass(env) else type(env)
    mine, base = getattr(cls, hook), getattr(Environment, hook)
    # Classmethods are bound anew at each access: compare their functions.
    if getattr(mine, "__func__", mine) is not getattr(base, "__func__", base):
        return True
    return not inspect.isclass(env) and hook in getattr(env, "__dict__", {})


def task_slice(total: int, start: Optional[int], stop: Optional[int]) -> range:
    """The indices [start, stop) of `total` tasks, with Python slice conventions."""
    return range(total)[slice(start, stop)]


def _declared_toolset(env: Environment, toolset_cls: type) -> Any:
    """The episode's instance of a toolset its class declares (`toolsets`),
    built on first use: `toolset_cls(env)`, or `toolset_cls()` for a
    constructor that takes no environment (decided by its signature, so a
    TypeError raised inside the constructor reaches the author as it is)."""
    instances = env.__dict__.setdefault("_toolset_instances", {})
    if toolset_cls not in instances:
        try:
            inspect.signature(toolset_cls).bind(env)
            takes_env = True
        except TypeError:
            takes_env = False
        instances[toolset_cls] = toolset_cls(env) if takes_env else toolset_cls()
    return instances[toolset_cls]


def _declared_toolset_tool(env: Environment, name: str) -> tuple[Callable[..., Any] | None, str | None]:
    for toolset_cls in type(env).toolsets:
        candidate = getattr(_declared_toolset(env, toolset_cls), name, None)
        if candidate is not None and Environment._is_tool(candidate):
            return candidate, toolset_cls.__name__
    return None, None


def resolve_tool(env: Environment, name: str, session_toolset: Any = None) -> Union[Callable[..., Any], RunToolOutput]:
    """The function of tool `name` of an episode, or the refusal (not_found,
    name_collision). A session's toolset comes first: its tools replace
    same-named ones of the environment."""
    if session_toolset is not None:
        session_fn = getattr(session_toolset, name, None)
        if session_fn is not None and Environment._is_tool(session_fn):
            return session_fn
    env_fn = getattr(env, name, None)
    has_env_tool = env_fn is not None and Environment._is_tool(env_fn)
    toolset_fn, toolset_source = _declared_toolset_tool(env, name)
    if has_env_tool and toolset_fn is not None:
        return RunToolOutput(RunToolError(
            error=f"Tool name collision: '{name}' is defined in both the environment "
            f"and toolset '{toolset_source}'. Please rename one of them to avoid conflicts.",
            reason="name_collision",
        ))
    fn = env_fn if has_env_tool else toolset_fn
    if fn is None:
        return not_a_tool(name)
    return fn


def not_a_tool(name: str) -> RunToolOutput:
    """The refusal of a call to `name`, which is no tool of the episode (not_found)."""
    return RunToolOutput(RunToolError(error=f"{name!r} is not a valid tool", reason="not_found"))


def tool_argument(fn: Callable[..., Any], input: JSONObject) -> Union[tuple[Any, ...], RunToolOutput]:
    """The arguments to call tool function `fn` with for `input` (its input
    model, or none), or the refusal (input_validation)."""
    model = _input_model(fn)
    if model is None:
        return ()
    try:
        return (model(**input),)
    except ValidationError as exc:
        # The reference's words first (openreward's client reads the reason off them from servers
        # that send none), then each wrong field on a line of its own.
        fields = describe_validation_error(exc)
        return RunToolOutput(RunToolError(
            error=f"Tool input validation error:{chr(10) if chr(10) in fields else ' '}{fields}",
            reason="input_validation",
        ))


def tool_result(name: str, result: Any) -> RunToolOutput:
    """What tool `name` returned, as a successful call's output."""
    if not isinstance(result, ToolOutput):
        raise TypeError(f"{name!r} returned {type(result).__name__}; expected ToolOutput")
    return RunToolOutput(RunToolSuccess(output=result))
