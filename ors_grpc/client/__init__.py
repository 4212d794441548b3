"""Python clients of the ORS gRPC service: `ORSClient` (blocking) and `AsyncORSClient`.

Results are pure Python: `ors_grpc.types` models (ToolOutput, TextBlock,
ImageBlock, ToolSpec, Split, Message, GroupScore, TerminalToolSpec) and
plain JSON values, never proto messages.
"""

from ..types import (
    GroupCandidate,
    GroupScore,
    ImageBlock,
    Message,
    Split,
    TerminalToolSpec,
    TextBlock,
    ToolOutput,
    ToolSpec,
)
from ._tool_formats import Provider
from .aio import AsyncEnvironment, AsyncORSClient
from .errors import ORSServerError, ScoreGroupFailedError, ToolCallError, ToolError, ToolFailedError
from .session import AsyncSession
from .sync import Environment, ORSClient, Session
from .types import Health, Task

__all__ = [
    "AsyncEnvironment",
    "AsyncORSClient",
    "AsyncSession",
    "Environment",
    "GroupCandidate",
    "GroupScore",
    "Health",
    "ImageBlock",
    "Message",
    "ORSClient",
    "ORSServerError",
    "Provider",
    "ScoreGroupFailedError",
    "Session",
    "Split",
    "Task",
    "TerminalToolSpec",
    "TextBlock",
    "ToolCallError",
    "ToolError",
    "ToolFailedError",
    "ToolOutput",
    "ToolSpec",
]
