"""The ORS data types, as pydantic models identical to the reference SDK's.

These are the authoring API's types (`ors_grpc.ToolOutput`, ...): an
environment written against `ors` (ors-sdk 0.1.0) builds the same objects
here. The gRPC wire forms live in `_generated`; `_convert` maps between them.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Sequence, Union

from pydantic import BaseModel, Field, RootModel, model_validator
from typing_extensions import TypeAliasType

__all__ = [
    "Blocks",
    "CreateSession",
    "ImageBlock",
    "JSONObject",
    "JSONValue",
    "ListToolsOutput",
    "RunToolError",
    "RunToolOutput",
    "RunToolSuccess",
    "Split",
    "SplitType",
    "TextBlock",
    "ToolCall",
    "ToolOutput",
    "ToolSpec",
]

JSONValue = TypeAliasType(
    "JSONValue", Union[Mapping[str, Any], Sequence[Any], str, int, float, bool, None]
)
JSONObject = Mapping[str, JSONValue]


class TextBlock(BaseModel, extra="forbid"):
    """Text content."""

    text: str
    detail: Optional[JSONObject] = None
    type: Literal["text"] = "text"


class ImageBlock(BaseModel, extra="forbid"):
    """Image content; `data` is base64 text, as in the reference SDK."""

    data: str
    mimeType: str
    detail: Optional[JSONObject] = None
    type: Literal["image"] = "image"


Blocks = TypeAliasType("Blocks", Sequence[Union[TextBlock, ImageBlock]])


class ToolOutput(BaseModel, extra="forbid"):
    """What a tool returns: content, optional reward, and whether the episode is over."""

    blocks: Blocks
    metadata: Optional[JSONObject] = None
    reward: Optional[float] = None
    finished: bool = False


class RunToolSuccess(BaseModel, extra="forbid"):
    """The tool ran."""

    ok: Literal[True] = True
    output: ToolOutput


class RunToolError(BaseModel, extra="forbid"):
    """The call was refused without running the tool."""

    ok: Literal[False] = False
    error: str


class RunToolOutput(RootModel[Union[RunToolSuccess, RunToolError]]):
    """The outcome of a dispatched tool call."""

    root: Union[RunToolSuccess, RunToolError] = Field(discriminator="ok")


class ToolSpec(BaseModel, extra="forbid"):
    """A tool the agent may call."""

    name: str
    description: str
    input_schema: Optional[JSONObject]


class ListToolsOutput(BaseModel, extra="forbid"):
    """A list of tool specs."""

    tools: list[ToolSpec]


class ToolCall(BaseModel, extra="forbid"):
    """A request to run one tool (or attach to an earlier call by task id)."""

    name: str
    input: JSONObject
    task_id: Optional[str] = None


class CreateSession(BaseModel, extra="forbid"):
    """The body of an episode creation request."""

    env_name: Optional[str] = None
    task_spec: Optional[JSONObject] = None
    split: Optional[str] = None
    index: Optional[int] = None
    secrets: Optional[Mapping[str, str]] = None

    @model_validator(mode="after")
    def check_task_source(self) -> "CreateSession":
        """Exactly one of task_spec or (split, index) must be provided."""
        has_spec = self.task_spec is not None
        has_index = self.split is not None and self.index is not None
        if has_spec == has_index:
            raise ValueError("Provide either task_spec or both split and index, not both/neither")
        if (self.split is None) != (self.index is None):
            raise ValueError("split and index must both be provided together")
        return self


SplitType = Literal["train", "validation", "test"]


class Split(BaseModel, extra="forbid"):
    """A named set of tasks and what it is for."""

    name: str
    type: SplitType
