"""Python clients of the ORS gRPC service: `ORSClient` (blocking) and `AsyncORSClient`.

Results are pure Python: `ors_grpc.types` models (ToolOutput, TextBlock,
ImageBlock, ToolSpec, Split) and plain JSON values, never proto messages.
"""

from ..types import ImageBlock, Split, TextBlock, ToolOutput, ToolSpec
from ._tool_formats import Provider
from .aio import AsyncEnvironment, AsyncORSClient
from .errors import ORSServerError, ToolCallError, ToolError, ToolFailedError
from .session import AsyncSession
from .sync import Environment, ORSClient, Session
from .types import Health, Task

__all__ = [
    "AsyncEnvironment",
    "AsyncORSClient",
    "AsyncSession",
    "Environment",
    "Health",
    "ImageBlock",
    "ORSClient",
    "ORSServerError",
    "Provider",
    "Session",
    "Split",
    "Task",
    "TextBlock",
    "ToolCallError",
    "ToolError",
    "ToolFailedError",
    "ToolOutput",
    "ToolSpec",
]
