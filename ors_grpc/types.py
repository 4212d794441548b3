"""The ORS data types, as pydantic models identical to the reference SDK's.

These are the authoring API's types (`ors_grpc.ToolOutput`, ...): an
environment written against `ors` (ors-sdk 0.1.0) builds the same objects
here (same fields, defaults and JSON schemas: the models carry no docstrings,
which pydantic would add to the schemas). The gRPC wire forms live in
`_generated`; `_convert` maps between them.
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


# Text content.
class TextBlock(BaseModel, extra="forbid"):
    text: str
    detail: Optional[JSONObject] = None
    type: Literal["text"] = "text"


# Image content; `data` is base64 text, as in the reference SDK.
class ImageBlock(BaseModel, extra="forbid"):
    data: str
    mimeType: str
    detail: Optional[JSONObject] = None
    type: Literal["image"] = "image"


Blocks = TypeAliasType("Blocks", Sequence[Union[TextBlock, ImageBlock]])


# What a tool returns: content, optional reward, and whether the episode is over.
class ToolOutput(BaseModel, extra="forbid"):
    blocks: Blocks
    metadata: Optional[JSONObject] = None
    reward: Optional[float] = None
    finished: bool = False


# The tool ran.
class RunToolSuccess(BaseModel, extra="forbid"):
    ok: Literal[True] = True
    output: ToolOutput


# The call was refused without running the tool.
class RunToolError(BaseModel, extra="forbid"):
    ok: Literal[False] = False
    error: str


# The outcome of a dispatched tool call.
class RunToolOutput(RootModel[Union[RunToolSuccess, RunToolError]]):
    root: Union[RunToolSuccess, RunToolError] = Field(discriminator="ok")


# A tool the agent may call.
class ToolSpec(BaseModel, extra="forbid"):
    name: str
    description: str
    input_schema: Optional[JSONObject]


# A list of tool specs.
class ListToolsOutput(BaseModel, extra="forbid"):
    tools: list[ToolSpec]


# A request to run one tool (or attach to an earlier call by task id).
class ToolCall(BaseModel, extra="forbid"):
    name: str
    input: JSONObject
    task_id: Optional[str] = None


# The body of an episode creation request.
class CreateSession(BaseModel, extra="forbid"):
    env_name: Optional[str] = None
    task_spec: Optional[JSONObject] = None
    split: Optional[str] = None
    index: Optional[int] = None
    secrets: Optional[Mapping[str, str]] = None

    @model_validator(mode="after")
    def check_task_source(self) -> "CreateSession":
        """Exactly one of task_spec or (split, index) must be provided."""
        check_task_source(self.task_spec, self.split, self.index)
        return self


def check_task_source(task_spec: Any, split: Optional[str], index: Optional[int]) -> None:
    """Raise ValueError (the reference's messages) unless exactly one of
    `task_spec` or `split` + `index` is given."""
    has_spec = task_spec is not None
    has_index = split is not None and index is not None
    if has_spec == has_index:
        raise ValueError("Provide either task_spec or both split and index, not both/neither")
    if (split is None) != (index is None):
        raise ValueError("split and index must both be provided together")


SplitType = Literal["train", "validation", "test"]


# A named set of tasks and what it is for.
class Split(BaseModel, extra="forbid"):
    name: str
    type: SplitType
