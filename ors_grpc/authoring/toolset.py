"""Toolsets: reusable collections of tools shared by several environments."""

from __future__ import annotations

from abc import ABC
from typing import Any

__all__ = ["Toolset"]


class Toolset(ABC):
    """A collection of `@tool` methods an environment lists in `toolsets`.

    Usage::

        class MyToolset(Toolset):
            @tool
            async def my_tool(self) -> ToolOutput:
                return ToolOutput(blocks=[TextBlock(text="Hello")])

        class MyEnv(Environment):
            toolsets = [MyToolset]

    A toolset registered with the server (`create_server(..., toolsets=...)`,
    `ors-grpc serve --toolset`) can also be attached to one session by name
    (`toolset_name` at episode creation): its tools then join that session's,
    replacing same-named ones, and its `@terminal` tool wins.
    """

    def __init__(self, env: Any, sandbox_attr: str = "sandbox"):
        #: The environment instance that owns this toolset.
        self.env = env
        #: The environment's sandbox (its `sandbox_attr` attribute), as
        #: openreward's toolsets expect; None when it has none.
        self.sandbox = getattr(env, sandbox_attr, None)

    @classmethod
    def name(cls) -> str:
        """The name the toolset is registered and attached by: its class name."""
        return cls.__name__
