"""`tool_marks`: what the server learns of a tool to schedule its calls, read off the classes
(where a worker host reads it) as `resolve_tool` would find the tool."""

from __future__ import annotations

from pydantic import BaseModel

from ors_grpc import Environment, ToolOutput, Toolset, tool
from ors_grpc.authoring.environment import ToolMarks, marks_of, terminal, tool_marks


class Answer(BaseModel):
    text: str = ""


class Declared(Toolset):
    @tool(exclusive=True)
    def lock(self) -> ToolOutput: ...


class Session(Toolset):
    @tool(concurrent=True)
    def look(self) -> ToolOutput: ...


class Marked(Environment):
    toolsets = [Declared]

    @tool
    def plain(self) -> ToolOutput: ...

    @tool(concurrent=True)
    def look(self) -> ToolOutput: ...

    @tool(exclusive=True, concurrent=True)
    def submit(self, answer: Answer) -> ToolOutput: ...

    @terminal
    @tool
    def final(self, answer: Answer) -> ToolOutput: ...

    def helper(self) -> ToolOutput: ...

    @tool
    def broken(self, a: int, b: int) -> ToolOutput: ...

    @classmethod
    def list_tasks(cls, split: str) -> list:
        return []

    @classmethod
    def list_splits(cls) -> list:
        return []


def test_the_marks_of_each_kind_of_tool() -> None:
    assert tool_marks(Marked, "plain") == ToolMarks(exclusive=False, concurrent=False, terminal=False)
    assert tool_marks(Marked, "look") == ToolMarks(concurrent=True)
    # Exclusive wins over concurrent; a terminal tool runs alone.
    assert tool_marks(Marked, "submit") == ToolMarks(exclusive=True)
    assert tool_marks(Marked, "final") == ToolMarks(exclusive=True, terminal=True)


def test_not_a_tool_is_none() -> None:
    for name in ("helper", "broken", "nosuch", "list_tasks"):
        assert tool_marks(Marked, name) is None


def test_found_where_resolve_tool_finds_it() -> None:
    assert tool_marks(Marked, "lock") == ToolMarks(exclusive=True)  # a declared toolset's
    assert tool_marks(Marked, "look", Session) == ToolMarks(concurrent=True)
    assert tool_marks(Marked, "plain", Session) == ToolMarks()  # the session toolset lacks it: the environment's


def test_an_instance_reads_the_same_and_marks_of_reads_a_function() -> None:
    env = Marked({})
    assert tool_marks(env, "submit") == tool_marks(Marked, "submit")
    assert marks_of(env.final) == ToolMarks(exclusive=True, terminal=True)
    assert marks_of(env.helper) == ToolMarks()
