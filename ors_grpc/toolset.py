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
    """

    def __init__(self, env: Any):
        #: The environment instance that owns this toolset.
        self.env = env
