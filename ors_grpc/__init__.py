"""ORS over gRPC: author environments as with the reference SDKs, serve them over gRPC.

    from ors_grpc import Environment, tool, Toolset, Split, TextBlock, ImageBlock, ToolOutput

is a drop-in for the same import from `ors` (ors-sdk 0.1.0), and

    from ors_grpc import Environment, tool, terminal, Message, GroupScore, ...

for the same import from `openreward.environments` (openreward >= 0.1.157).
"""

from ors_grpc._version import __version__
from ors_grpc.authoring.environment import Environment, terminal, tool
from ors_grpc.authoring.toolset import Toolset
from ors_grpc.authoring.types import (
    SUPPORTED_MESSAGE_BLOCK_TYPES,
    Blocks,
    CreateSession,
    GroupCandidate,
    GroupScore,
    ImageBlock,
    JSONObject,
    JSONValue,
    ListToolsOutput,
    Message,
    MessageBlocks,
    ReasoningBlock,
    Role,
    RunToolError,
    RunToolOutput,
    RunToolSuccess,
    Split,
    TerminalToolSpec,
    TextBlock,
    ToolCall,
    ToolCallBlock,
    ToolOutput,
    ToolResultBlock,
    ToolSpec,
)


def __getattr__(name: str):
    # `Server` pulls in grpc and the service: import it only when asked for.
    if name == "Server":
        from ors_grpc.server import Server

        return Server
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SUPPORTED_MESSAGE_BLOCK_TYPES",
    "Blocks",
    "CreateSession",
    "Environment",
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
    "RunToolOutput",
    "RunToolSuccess",
    "Server",
    "Split",
    "TerminalToolSpec",
    "TextBlock",
    "ToolCall",
    "ToolCallBlock",
    "ToolOutput",
    "ToolResultBlock",
    "ToolSpec",
    "Toolset",
    "__version__",
    "terminal",
    "tool",
]
