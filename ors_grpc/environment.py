"""The `Environment` base class and the `@tool` decorator.

Same surface and defaults as the reference SDK (ors-sdk 0.1.0), so an
environment written for `ors` runs here after changing only its import. One
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

from .types import (
    Blocks,
    JSONObject,
    ListToolsOutput,
    RunToolError,
    RunToolOutput,
    RunToolSuccess,
    Split,
    ToolOutput,
    ToolSpec,
)
from .user_code import run_user_code

__all__ = ["Environment", "ToolSignatureError", "tool"]

logger = logging.getLogger("ors_grpc.environment")


@overload
def tool(fn: Callable[..., Any]) -> Callable[..., Any]: ...
@overload
def tool(*, shared: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
def tool(fn: Optional[Callable[..., Any]] = None, *, shared: bool = True) -> Callable[..., Any]:
    """Mark a method as a tool: `@tool`, or `@tool(shared=False)` for a tool
    that `list_tools` does not advertise (a task-specific tool)."""

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        setattr(f, "_env_tool", True)
        setattr(f, "_env_tool_shared", shared)
        return f

    return mark if fn is None else mark(fn)


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

    @abstractmethod
    def get_prompt(self) -> Union[Blocks, Awaitable[Blocks]]:
        """The prompt for the current task."""

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
        """The shared tools of this class and its toolsets (cached per class).

        A @tool whose signature cannot work (shared or not) raises
        ToolSignatureError, naming the method and the rule it breaks."""
        for owner in (cls, *cls.toolsets):
            _check_tool_signatures(owner)
        out: list[ToolSpec] = []
        env_tool_names: set[str] = set()
        for name in dir(cls):
            fn = getattr(cls, name)
            if cls._is_tool(fn) and getattr(fn, "_env_tool_shared", True):
                out.append(_tool_spec(name, fn))
                env_tool_names.add(name)
        for toolset_cls in cls.toolsets:
            for name in dir(toolset_cls):
                fn = getattr(toolset_cls, name)
                if not cls._is_tool(fn) or not getattr(fn, "_env_tool_shared", True):
                    continue
                if name in env_tool_names:
                    raise ValueError(
                        f"Tool name collision: '{name}' is defined in both the environment "
                        f"and toolset '{toolset_cls.__name__}'. Please rename one of them to avoid conflicts."
                    )
                out.append(_tool_spec(name, fn))
        return ListToolsOutput(tools=out)

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

    async def _call_tool(
        self, name: str, input: JSONObject, *, sync_lock: asyncio.Lock | None = None
    ) -> RunToolOutput:
        """Run tool `name` on `input`; unknown names and invalid input are
        tool-level errors, exceptions of the tool propagate. `sync_lock`: see
        `run_user_code`."""
        env_fn = getattr(self, name, None)
        has_env_tool = env_fn is not None and self._is_tool(env_fn)
        toolset_fn, toolset_source = self._find_toolset_tool(name)
        if has_env_tool and toolset_fn is not None:
            return RunToolOutput(RunToolError(
                error=f"Tool name collision: '{name}' is defined in both the environment "
                f"and toolset '{toolset_source}'. Please rename one of them to avoid conflicts."
            ))
        fn = env_fn if has_env_tool else toolset_fn
        if fn is None:
            return RunToolOutput(RunToolError(error=f"{name!r} is not a valid tool"))
        _, hints, params = _introspect_tool(fn)
        if params:
            model: type[BaseModel] = hints[params[0].name]
            try:
                arg = model(**input)
            except ValidationError as exc:
                return RunToolOutput(RunToolError(error=f"Tool input validation error: {str(exc.errors())}"))
            result = await run_user_code(fn, arg, sync_lock=sync_lock, on_loop=self.sync_code_on_loop)
        else:
            result = await run_user_code(fn, sync_lock=sync_lock, on_loop=self.sync_code_on_loop)
        if not isinstance(result, ToolOutput):
            raise TypeError(f"{name!r} returned {type(result).__name__}; expected ToolOutput")
        return RunToolOutput(RunToolSuccess(output=result))

    @classmethod
    def name(cls) -> str:
        return cls.__name__
