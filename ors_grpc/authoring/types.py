"""The ORS data types, as pydantic models identical to the reference SDKs'.

These are the authoring API's types (`ors_grpc.ToolOutput`, ...): an
environment written against `ors` (ors-sdk 0.1.0) or `openreward.environments`
(openreward >= 0.1.157) builds the same objects here (same fields, defaults,
validation and JSON shapes). openreward's types are a superset of ors-sdk's:
its additions (messages and their rich blocks, the terminal tool, group
scores, refusal reasons) are optional fields or new models, so an ors-sdk
environment never meets them. The models carry no docstrings, which pydantic
would add to their JSON schemas. The gRPC wire forms live in `_generated`;
`_convert` maps between them.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional, Sequence, Union

from pydantic import BaseModel, Field, RootModel, model_validator
from typing_extensions import TypeAliasType

__all__ = [
    "SUPPORTED_MESSAGE_BLOCK_TYPES",
    "Blocks",
    "CreateSession",
    "GroupCandidate",
    "GroupScore",
    "ImageBlock",
    "JSONObject",
    "JSONValue",
    "ListToolsOutput",
    "Message",
    "MessageBlocks",
    "ReasoningBlock",
    "Role",
    "RunToolError",
    "RunToolErrorReason",
    "RunToolOutput",
    "RunToolSuccess",
    "ScoreGroup",
    "ScoreGroupOutput",
    "Split",
    "SplitType",
    "TerminalToolSpec",
    "TextBlock",
    "ToolCall",
    "ToolCallBlock",
    "ToolOutput",
    "ToolResultBlock",
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

Role = Literal["system", "user", "assistant"]


# A reasoning (thinking) segment of an assistant turn, in plain text;
# `signature` passes a provider's signed thinking through for replay.
class ReasoningBlock(BaseModel, extra="forbid"):
    text: str
    signature: Optional[str] = None
    detail: Optional[JSONObject] = None
    type: Literal["reasoning"] = "reasoning"


# A tool invocation inside an assistant turn.
class ToolCallBlock(BaseModel, extra="forbid"):
    id: str
    name: str
    input: JSONObject
    detail: Optional[JSONObject] = None
    type: Literal["tool_call"] = "tool_call"


# A tool's result inside a user turn, matched to its call by `tool_call_id`.
class ToolResultBlock(BaseModel, extra="forbid"):
    tool_call_id: str
    blocks: Blocks
    is_error: bool = False
    detail: Optional[JSONObject] = None
    type: Literal["tool_result"] = "tool_result"


MessageBlocks = TypeAliasType(
    "MessageBlocks",
    Sequence[Union[TextBlock, ImageBlock, ReasoningBlock, ToolCallBlock, ToolResultBlock]],
)

#: The block types a message may carry here; tool listings advertise them
#: (`ListToolsOutput.message_block_types`).
SUPPORTED_MESSAGE_BLOCK_TYPES = ["text", "image", "reasoning", "tool_call", "tool_result"]

# Where each block type may appear (Anthropic's placement): reasoning and
# tool calls are the assistant's, tool results come back in user turns.
_BLOCK_TYPES_BY_ROLE: dict[str, frozenset[str]] = {
    "system": frozenset({"text", "image"}),
    "user": frozenset({"text", "image", "tool_result"}),
    "assistant": frozenset({"text", "image", "reasoning", "tool_call"}),
}


# One turn of a conversation (`Environment.get_messages`, group candidates).
class Message(BaseModel, extra="forbid"):
    role: Role
    blocks: MessageBlocks
    detail: Optional[JSONObject] = None

    @model_validator(mode="after")
    def check_block_placement(self) -> "Message":
        """Each block must be allowed in its message's role."""
        allowed = _BLOCK_TYPES_BY_ROLE[self.role]
        misplaced = next((block for block in self.blocks if block.type not in allowed), None)
        if misplaced is not None:
            raise ValueError(
                f"A {misplaced.type!r} block is not valid in a {self.role!r} message: "
                f"reasoning and tool_call blocks belong in 'assistant' turns, "
                f"tool_result blocks in 'user' turns (Anthropic placement semantics)."
            )
        return self


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


RunToolErrorReason = Literal["not_found", "name_collision", "input_validation", "episode_finished"]


# The call was refused without running the tool; `reason` says why (None
# from servers that predate it).
class RunToolError(BaseModel, extra="forbid"):
    ok: Literal[False] = False
    error: str
    reason: Optional[RunToolErrorReason] = None


# The outcome of a dispatched tool call.
class RunToolOutput(RootModel[Union[RunToolSuccess, RunToolError]]):
    root: Union[RunToolSuccess, RunToolError] = Field(discriminator="ok")


# A tool the agent may call.
class ToolSpec(BaseModel, extra="forbid"):
    name: str
    description: str
    input_schema: Optional[JSONObject]


# The environment's terminal tool: hidden from the tool list, it receives the
# agent's final plain message as its one input field `arg` (None: no input).
class TerminalToolSpec(BaseModel, extra="forbid"):
    name: str
    arg: Optional[str] = None
    description: str = ""


# A list of tool specs, and what else a client may use: the terminal tool,
# group scoring, the block types messages may carry (None: not reported).
class ListToolsOutput(BaseModel, extra="forbid"):
    tools: list[ToolSpec]
    terminal_tool: Optional[TerminalToolSpec] = None
    supports_score_group: Optional[bool] = None
    message_block_types: Optional[list[str]] = None


# One rollout's completion submitted for group scoring; `metadata` is the
# caller's, echoed untouched.
class GroupCandidate(BaseModel, extra="forbid"):
    messages: list[Message]
    metadata: Optional[JSONObject] = None


# The score of one group candidate, index-aligned with the candidates.
class GroupScore(BaseModel, extra="forbid"):
    reward: float
    metadata: Optional[JSONObject] = None


# A group scoring request (or, with `task_id`, an attach to an earlier one).
class ScoreGroup(BaseModel, extra="forbid"):
    candidates: list[GroupCandidate]
    task_id: Optional[str] = None


# The scores of a group, one per candidate.
class ScoreGroupOutput(BaseModel, extra="forbid"):
    scores: list[GroupScore]


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
    toolset_name: Optional[str] = None

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
