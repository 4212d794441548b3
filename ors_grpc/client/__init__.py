"""Python clients of the ORS gRPC service: `ORSClient` (blocking) and `AsyncORSClient`.

Results are pure Python: `ors_grpc.authoring.types` models (ToolOutput, TextBlock,
ImageBlock, ToolSpec, Split, Message, GroupScore, TerminalToolSpec) and
plain JSON values, never proto messages.
"""

from ors_grpc.authoring.types import (
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
from ors_grpc.client._tool_formats import Provider
from ors_grpc.client.aio import AsyncEnvironment, AsyncORSClient
from ors_grpc.client.errors import ORSServerError, ScoreGroupFailedError, ToolCallError, ToolError, ToolFailedError
from ors_grpc.client.session import AsyncSession
from ors_grpc.client.sync import Environment, ORSClient, Session
from ors_grpc.client.types import EpisodeRecord, EpisodeTotals, Health, Task, ToolCallRecord

__all__ = [
    "AsyncEnvironment",
    "AsyncORSClient",
    "AsyncSession",
    "Environment",
    "EpisodeRecord",
    "EpisodeTotals",
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
    "ToolCallRecord",
    "ToolError",
    "ToolFailedError",
    "ToolOutput",
    "ToolSpec",
]
