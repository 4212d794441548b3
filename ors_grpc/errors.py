"""ORS errors: one exception type, one table from reason to gRPC and HTTP.

Every layer raises `ORSError`; the gRPC service turns it into a status with an
`ors-error-reason` trailing metadata entry, and the HTTP bridge turns that
status back into an HTTP status and `{"detail": message}`. The message
reaches clients: never put secrets or tracebacks in it.
"""

from __future__ import annotations

from typing import NamedTuple

import grpc

from ._generated.ors.v1 import errors_pb2

__all__ = [
    "ERROR_REASON_METADATA_KEY",
    "GRPC_TO_HTTP",
    "ORSError",
    "REASONS",
    "RETRY_AFTER_S",
    "Reason",
    "abort",
    "http_status_for",
]

#: Trailing metadata key carrying the ErrorReason name of a failed RPC.
ERROR_REASON_METADATA_KEY = "ors-error-reason"

Reason = errors_pb2.ErrorReason.ValueType


class Mapping(NamedTuple):
    code: grpc.StatusCode
    http_status: int


#: Each domain error's gRPC code and ORS HTTP status (../shared/spec/ORS.md).
#: HTTP statuses that differ from GRPC_TO_HTTP are ORS's own choices.
REASONS: dict[int, Mapping] = {
    errors_pb2.ERROR_REASON_INVALID_REQUEST: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 422),
    errors_pb2.ERROR_REASON_UNKNOWN_ENVIRONMENT: Mapping(grpc.StatusCode.NOT_FOUND, 404),
    errors_pb2.ERROR_REASON_INVALID_SPLIT: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 400),
    errors_pb2.ERROR_REASON_INVALID_INDEX: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 400),
    errors_pb2.ERROR_REASON_LISTING_UNSUPPORTED: Mapping(grpc.StatusCode.FAILED_PRECONDITION, 400),
    errors_pb2.ERROR_REASON_SESSION_EXISTS: Mapping(grpc.StatusCode.ALREADY_EXISTS, 400),
    errors_pb2.ERROR_REASON_SESSION_NOT_FOUND: Mapping(grpc.StatusCode.NOT_FOUND, 404),
    errors_pb2.ERROR_REASON_SESSION_DELETED: Mapping(grpc.StatusCode.ABORTED, 410),
    errors_pb2.ERROR_REASON_SETUP_FAILED: Mapping(grpc.StatusCode.FAILED_PRECONDITION, 500),
    errors_pb2.ERROR_REASON_UNKNOWN_TASK_ID: Mapping(grpc.StatusCode.NOT_FOUND, 404),
    errors_pb2.ERROR_REASON_TOO_MANY_SESSIONS: Mapping(grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    errors_pb2.ERROR_REASON_UNAUTHENTICATED: Mapping(grpc.StatusCode.UNAUTHENTICATED, 401),
    errors_pb2.ERROR_REASON_SCORE_GROUP_UNSUPPORTED: Mapping(grpc.StatusCode.UNIMPLEMENTED, 404),
    errors_pb2.ERROR_REASON_UNKNOWN_TOOLSET: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 400),
    # Detail `Environment still starting.`; the bridge adds `X-Backend-State: starting` and `Retry-After`.
    errors_pb2.ERROR_REASON_ENVIRONMENT_STARTING: Mapping(grpc.StatusCode.UNAVAILABLE, 503),
}

#: Seconds to wait before retrying, per reason: sent as the `retry-after`
#: trailing metadata entry (the bridge's `Retry-After` header).
RETRY_AFTER_S: dict[int, int] = {
    errors_pb2.ERROR_REASON_TOO_MANY_SESSIONS: 1,
    errors_pb2.ERROR_REASON_ENVIRONMENT_STARTING: 2,
}

#: gRPC code to HTTP status for errors without an ORS reason, as in
#: google/rpc/code.proto (and connect-go's table).
GRPC_TO_HTTP: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}


class ORSError(Exception):
    """A domain error with a closed-set reason. Its message reaches clients."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    @property
    def code(self) -> grpc.StatusCode:
        return REASONS[self.reason].code

    @property
    def reason_name(self) -> str:
        return errors_pb2.ErrorReason.Name(self.reason)


async def abort(context: grpc.aio.ServicerContext, error: ORSError) -> None:
    """End an RPC with `error`: its code and message, its reason as the
    `ors-error-reason` trailing metadata entry (and `retry-after` when the
    server is full or the environment still starting). Raises, as
    `context.abort` does."""
    metadata = [(ERROR_REASON_METADATA_KEY, error.reason_name)]
    retry_after_s = RETRY_AFTER_S.get(error.reason)
    if retry_after_s is not None:
        metadata.append(("retry-after", str(retry_after_s)))
    await context.abort(error.code, error.message, trailing_metadata=tuple(metadata))


def http_status_for(code: grpc.StatusCode, reason_name: str | None) -> int:
    """The HTTP status of a failed RPC: by its ORS reason, else by its code."""
    if reason_name:
        try:
            return REASONS[errors_pb2.ErrorReason.Value(reason_name)].http_status
        except (ValueError, KeyError):
            pass
    return GRPC_TO_HTTP.get(code, 500)
