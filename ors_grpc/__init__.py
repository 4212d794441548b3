"""ORS over gRPC: author environments as with the reference SDK, serve them over gRPC.

    from ors_grpc import Environment, tool, Toolset, Split, TextBlock, ImageBlock, ToolOutput

is a drop-in for the same import from `ors` (ors-sdk 0.1.0).
"""

from .environment import Environment, tool
from .toolset import Toolset
from .types import (
    Blocks,
    CreateSession,
    ImageBlock,
    JSONObject,
    JSONValue,
    ListToolsOutput,
    RunToolError,
    RunToolOutput,
    RunToolSuccess,
    Split,
    TextBlock,
    ToolCall,
    ToolOutput,
    ToolSpec,
)

__version__ = "0.1.0"


def __getattr__(name: str):
    # `Server` pulls in grpc and the service: import it only when asked for.
    if name == "Server":
        from .server import Server

        return Server
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Blocks",
    "CreateSession",
    "Environment",
    "ImageBlock",
    "JSONObject",
    "JSONValue",
    "ListToolsOutput",
    "RunToolError",
    "RunToolOutput",
    "RunToolSuccess",
    "Server",
    "Split",
    "TextBlock",
    "ToolCall",
    "ToolOutput",
    "ToolSpec",
    "Toolset",
    "__version__",
    "tool",
]
