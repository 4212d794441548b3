"""The client's exceptions: one for failed RPCs, two for tool calls that did not produce an output, one for a failed group scoring."""

from __future__ import annotations

from typing import Any, Optional

import grpc

from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc.protocol.constants import ERROR_REASON_METADATA_KEY

__all__ = [
    "ORSServerError",
    "ScoreGroupFailedError",
    "ToolCallError",
    "ToolError",
    "ToolFailedError",
]

_UNSPECIFIED = "ERROR_REASON_UNSPECIFIED"
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


class ORSServerError(Exception):
    """An RPC failed. `reason` is the ErrorReason name the server sent
    (`ERROR_REASON_UNSPECIFIED` when it sent none, e.g. for transport errors),
    `code` the gRPC status code, `message` the server's human-readable text."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(f"{reason} ({code.name}): {message}")
        self.code = code
        self.reason = reason
        self.message = message

    @classmethod
    def from_rpc_error(cls, error: grpc.aio.AioRpcError) -> "ORSServerError":
        return cls(error.code(), _reason_of(error), error.details() or "")

    @classmethod
    def from_step_error(cls, error: Any) -> "ORSServerError":
        """From a RunEpisode `StepError`: what the step's own RPC would have raised."""
        code = _STATUS_CODES.get(error.code, grpc.StatusCode.UNKNOWN)
        return cls(code, errors_pb2.ErrorReason.Name(error.reason), error.message)


def _reason_of(error: grpc.aio.AioRpcError) -> str:
    for key, value in error.trailing_metadata() or ():
        if key == ERROR_REASON_METADATA_KEY:
            return value if isinstance(value, str) else value.decode()
    return _UNSPECIFIED


class ToolError(Exception):
    """A tool call produced no output; see the two subclasses."""

    def __init__(self, tool_name: str, message: str) -> None:
        super().__init__(f"tool {tool_name!r}: {message}")
        self.tool_name = tool_name
        self.message = message


class ToolCallError(ToolError):
    """The server refused the call without running the tool (a tool-level
    error: unknown tool, input not matching its schema, episode finished).
    `reason` says which: `not_found`, `name_collision`, `input_validation`,
    `episode_finished`; None when the server gave none."""

    def __init__(self, tool_name: str, message: str, reason: Optional[str] = None) -> None:
        super().__init__(tool_name, message)
        self.reason = reason


class ToolFailedError(ToolError):
    """The tool ran and raised; `message` is its exception's message. The session lives on.
    (A call whose environment's process died under it is an ORSServerError,
    `ERROR_REASON_ENVIRONMENT_CRASHED`: the session is lost.)"""


class ScoreGroupFailedError(Exception):
    """The environment's group scoring raised, or returned a wrong number of
    scores; `message` says which. The session lives on: scoring may be retried."""

    def __init__(self, message: str) -> None:
        super().__init__(f"score_group: {message}")
        self.message = message
