"""ORS errors: one exception type, one table from reason to gRPC and HTTP.

Every layer raises `ORSError`; the gRPC service turns it into a status with an
`ors-error-reason` trailing metadata entry and the same error in the standard
rich error model (`google.rpc.Status` with an `ErrorInfo`, in
`grpc-status-details-bin`), both built here in `trailing_metadata`; the HTTP
bridge turns that status back into an HTTP status and `{"detail": message}`.
The message reaches clients: never put secrets, request bytes or tracebacks
in it. Every text that leaves as a status, a trailer, an `ErrorInfo` or an
HTTP `detail` is cut by `bounded_text` to `MAX_ERROR_TEXT_BYTES`, so that a
status always fits the 8 KiB soft metadata limit of grpc servers and
clients (an environment's exception message may be megabytes long); where a
text is cut, the whole (secret-masked) text goes to the log.
"""

from __future__ import annotations

import logging
import signal
from typing import Mapping as MappingType, NamedTuple, Optional, Sequence

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc.protocol.constants import ERROR_REASON_METADATA_KEY, MAX_ERROR_TEXT_BYTES, STATUS_DETAILS_METADATA_KEY

__all__ = [
    "CRASH_CAUSES",
    "CRASH_CAUSE_EXITED",
    "CRASH_CAUSE_MEMORY_LIMIT",
    "CRASH_CAUSE_SIGNAL",
    "CRASH_CAUSE_STALLED",
    "CRASH_CAUSE_TOOL_TIMEOUT",
    "CRASH_CAUSE_KEY",
    "CRASH_EXIT_STATUS_KEY",
    "CRASH_SIGNAL_KEY",
    "ERROR_DOMAIN",
    "GRPC_TO_HTTP",
    "ORSError",
    "REASONS",
    "RETRY_AFTER_S",
    "Reason",
    "STATUS_MESSAGE_TYPES",
    "abort",
    "bounded_text",
    "environment_crashed",
    "environment_crashed_from_exitcode",
    "ends_episode",
    "environment_error",
    "exit_text",
    "http_status_for",
    "invalid_index",
    "invalid_index_range",
    "invalid_split",
    "json_limit",
    "logged_bounded_text",
    "message_too_large",
    "session_not_found",
    "signal_name",
    "trailing_metadata",
    "unknown_environment",
]

logger = logging.getLogger("ors_grpc.errors")

#: `ErrorInfo.domain` of every ORS error.
ERROR_DOMAIN = "ors.v1"
#: Largest `ErrorInfo.metadata` value, in UTF-8 bytes (they are facts such as sizes).
MAX_ERROR_METADATA_BYTES = 128
#: The messages a refused call carries beside its responses' types: the
#: `google.rpc.Status` in `grpc-status-details-bin` and its details' types
#: (`trailing_metadata`). Reflection serves their files, so that generic tools
#: (grpcurl, grpcui, Postman) decode the details.
STATUS_MESSAGE_TYPES = (status_pb2.Status, error_details_pb2.ErrorInfo)

Reason = errors_pb2.ErrorReason.ValueType


class Mapping(NamedTuple):
    code: grpc.StatusCode
    http_status: int
    #: The episode is gone (never was, deleted, its process died): a task
    #: stream (`/call`, `/score_group`) that ends with this reason after its
    #: task id is answered this HTTP status while no byte has gone out. Any
    #: other reason there is the call's own failure: an SSE `error` event
    #: (with a `reason:` line), however quickly it came.
    ends_episode: bool = False


#: Each domain error's gRPC code and ORS HTTP status (../shared/spec/ORS.md).
#: HTTP statuses that differ from GRPC_TO_HTTP are ORS's own choices.
REASONS: dict[int, Mapping] = {
    errors_pb2.ERROR_REASON_INVALID_REQUEST: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 422),
    errors_pb2.ERROR_REASON_UNKNOWN_ENVIRONMENT: Mapping(grpc.StatusCode.NOT_FOUND, 404),
    errors_pb2.ERROR_REASON_INVALID_SPLIT: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 400),
    errors_pb2.ERROR_REASON_INVALID_INDEX: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 400),
    errors_pb2.ERROR_REASON_LISTING_UNSUPPORTED: Mapping(grpc.StatusCode.FAILED_PRECONDITION, 400),
    errors_pb2.ERROR_REASON_SESSION_EXISTS: Mapping(grpc.StatusCode.ALREADY_EXISTS, 400),
    errors_pb2.ERROR_REASON_SESSION_NOT_FOUND: Mapping(grpc.StatusCode.NOT_FOUND, 404, ends_episode=True),
    errors_pb2.ERROR_REASON_SESSION_DELETED: Mapping(grpc.StatusCode.ABORTED, 410, ends_episode=True),
    errors_pb2.ERROR_REASON_SETUP_FAILED: Mapping(grpc.StatusCode.FAILED_PRECONDITION, 500),
    errors_pb2.ERROR_REASON_UNKNOWN_TASK_ID: Mapping(grpc.StatusCode.NOT_FOUND, 404),
    errors_pb2.ERROR_REASON_TOO_MANY_SESSIONS: Mapping(grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    errors_pb2.ERROR_REASON_UNAUTHENTICATED: Mapping(grpc.StatusCode.UNAUTHENTICATED, 401),
    errors_pb2.ERROR_REASON_SCORE_GROUP_UNSUPPORTED: Mapping(grpc.StatusCode.UNIMPLEMENTED, 404),
    errors_pb2.ERROR_REASON_UNKNOWN_TOOLSET: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 400),
    # Detail `Environment still starting.`; the bridge adds `X-Backend-State: starting` and `Retry-After`.
    errors_pb2.ERROR_REASON_ENVIRONMENT_STARTING: Mapping(grpc.StatusCode.UNAVAILABLE, 503),
    # Retryable elsewhere: the bridge adds `Retry-After`; the clients retry under a new session id.
    errors_pb2.ERROR_REASON_DRAINING: Mapping(grpc.StatusCode.UNAVAILABLE, 503),
    errors_pb2.ERROR_REASON_PEER_NOT_LOCAL: Mapping(grpc.StatusCode.PERMISSION_DENIED, 403),
    # 422 as the IETF Idempotency-Key draft answers a key reused with another payload.
    errors_pb2.ERROR_REASON_IDEMPOTENCY_KEY_REUSED: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 422),
    # The reference answers 500 when the environment's code raises.
    errors_pb2.ERROR_REASON_ENVIRONMENT_ERROR: Mapping(grpc.StatusCode.INTERNAL, 500),
    # An answer over the limit: the server's side, not the client's (no 413,
    # which is about the request), and not worth a retry (no 429). A call's
    # answer over it is that call's failure: the episode lives on.
    errors_pb2.ERROR_REASON_MESSAGE_TOO_LARGE: Mapping(grpc.StatusCode.RESOURCE_EXHAUSTED, 500),
    errors_pb2.ERROR_REASON_SESSION_ID_MISMATCH: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 400),
    # Too deep or NaN (json_text's rules): the client's JSON, as any malformed request.
    errors_pb2.ERROR_REASON_JSON_LIMIT: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 400),
    errors_pb2.ERROR_REASON_TOOLSET_REFUSED: Mapping(grpc.StatusCode.INVALID_ARGUMENT, 400),
    # The process running the episode's code died: the episode is gone and
    # the call may have run, so nothing may retry it on its own. Never a 500
    # or a 502-504: ors-sdk retries every 5xx and 429, openreward's env-server
    # policy 429/502/503/504, our client UNAVAILABLE; 410 is retried by none,
    # and openreward turns it into SessionTerminatedError (the session marked
    # dead), which is the truth. ABORTED is not among Envoy's or grpc's
    # retriable codes (we list UNAVAILABLE only) and means "retry at a higher
    # level": start a new episode. As SESSION_DELETED, which it resembles.
    errors_pb2.ERROR_REASON_ENVIRONMENT_CRASHED: Mapping(grpc.StatusCode.ABORTED, 410, ends_episode=True),
}

#: Seconds to wait before retrying, per reason: sent as the `retry-after`
#: trailing metadata entry (the bridge's `Retry-After` header).
RETRY_AFTER_S: dict[int, int] = {
    errors_pb2.ERROR_REASON_TOO_MANY_SESSIONS: 1,
    errors_pb2.ERROR_REASON_ENVIRONMENT_STARTING: 2,
    errors_pb2.ERROR_REASON_DRAINING: 1,
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

    def __init__(self, reason: Reason, message: str, metadata: Optional[MappingType[str, str]] = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        #: Machine-readable facts for `ErrorInfo.metadata` (never secrets).
        self.metadata = dict(metadata or {})

    def __reduce__(self) -> tuple[type, tuple[Reason, str, dict[str, str]]]:
        # Pickled whole (an Exception pickles its args alone), so that one raised by
        # environment code in a worker process reaches the service as it does in-process.
        return type(self), (self.reason, self.message, self.metadata)

    @property
    def code(self) -> grpc.StatusCode:
        return REASONS[self.reason].code

    @property
    def reason_name(self) -> str:
        return errors_pb2.ErrorReason.Name(self.reason)


def bounded_text(text: str, limit_bytes: int = MAX_ERROR_TEXT_BYTES) -> str:
    """`text` if its UTF-8 form fits `limit_bytes`, else its start and a
    marker with its length, `... [cut: N characters in all]`, within
    `limit_bytes` in all. Always UTF-8 text (a lone surrogate becomes `?`),
    so that grpc can send it."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit_bytes:
        return data.decode("utf-8")
    marker = f" ... [cut: {len(text)} characters in all]"
    kept = data[: max(0, limit_bytes - len(marker))].decode("utf-8", errors="ignore")  # a split character dropped
    return kept + marker


def logged_bounded_text(text: str, what: str) -> str:
    """`bounded_text(text)`, logging the whole text when it is cut (`what`
    names it; the text must be secret-masked already)."""
    bounded = bounded_text(text)
    if bounded != text:
        logger.info("error_text_cut what=%s length=%d text=%s", what, len(text), text)
    return bounded


def json_limit(exc: ValueError) -> ORSError:
    """A request's JSON over json_text's rules (`exc` names the field)."""
    return ORSError(errors_pb2.ERROR_REASON_JSON_LIMIT, str(exc))


def environment_error(message: str) -> ORSError:
    """The environment's own code raised (outside a tool): `message` names
    the exception (secrets already masked)."""
    return ORSError(errors_pb2.ERROR_REASON_ENVIRONMENT_ERROR, message)


#: ENVIRONMENT_CRASHED's `ErrorInfo.metadata` keys: why the process ended
#: (one of CRASH_CAUSES), its exit status, or the name of the signal that
#: killed it (`SIGSEGV`).
CRASH_CAUSE_KEY = "cause"
CRASH_EXIT_STATUS_KEY = "exit_status"
CRASH_SIGNAL_KEY = "signal"
#: The process exited by itself (`os._exit`, a native abort's exit status).
CRASH_CAUSE_EXITED = "exited"
#: A signal from outside the server killed it (SIGSEGV, the OOM killer's SIGKILL).
CRASH_CAUSE_SIGNAL = "signal"
#: The server killed it: a call's code still ran a grace period after the call was cancelled (its tool
#: timeout, its caller gone, the server stopping at once).
CRASH_CAUSE_TOOL_TIMEOUT = "tool_timeout"
#: The server killed it: one piece of code held its event loop, or it stopped reporting, past the stall limit.
CRASH_CAUSE_STALLED = "stalled"
#: The server killed it: its memory went over the worker memory limit.
CRASH_CAUSE_MEMORY_LIMIT = "memory_limit"
CRASH_CAUSES = frozenset({
    CRASH_CAUSE_EXITED, CRASH_CAUSE_SIGNAL, CRASH_CAUSE_TOOL_TIMEOUT, CRASH_CAUSE_STALLED, CRASH_CAUSE_MEMORY_LIMIT,
})
#: How each cause reads in the message, after "the environment's worker process".
_CRASH_WORDING = {
    CRASH_CAUSE_TOOL_TIMEOUT: "was killed because a tool call ran on after it was cancelled (a tool timeout, or its caller gone)",
    CRASH_CAUSE_STALLED: "was killed because its event loop stalled",
    CRASH_CAUSE_MEMORY_LIMIT: "was killed for going over its memory limit",
}


def signal_name(signal_number: int) -> str:
    """`SIGSEGV` for 11; `signal 99` for a number with no name here."""
    try:
        return signal.Signals(signal_number).name
    except ValueError:
        return f"signal {signal_number}"


def exit_text(status: Optional[int]) -> str:
    """How a process ended (Popen's returncode: -N for signal N), for logs:
    `exit status 3`, `killed by SIGSEGV`, `exit status unknown`."""
    if status is None:
        return "exit status unknown"
    if status < 0:
        return f"killed by {signal_name(-status)}"
    return f"exit status {status}"


def environment_crashed(cause: str, *, exit_status: Optional[int] = None,
                        signal_number: Optional[int] = None) -> ORSError:
    """The process running an episode's environment code ended (`cause`, one
    of CRASH_CAUSES, with its exit status or the signal that ended it when
    known): ERROR_REASON_ENVIRONMENT_CRASHED with a message naming what
    happened, e.g. "the environment's worker process was killed by SIGSEGV;
    the episode's state is lost", and the facts in metadata."""
    if cause not in CRASH_CAUSES:
        raise ValueError(f"unknown crash cause {cause!r}; expected one of {sorted(CRASH_CAUSES)}")
    metadata = {CRASH_CAUSE_KEY: cause}
    if cause in _CRASH_WORDING:
        what = _CRASH_WORDING[cause]
    elif signal_number is not None:
        what = f"was killed by {signal_name(signal_number)}"
    elif exit_status is not None:
        what = f"exited with status {exit_status}"
    else:
        what = "ended"
    if signal_number is not None:
        metadata[CRASH_SIGNAL_KEY] = signal_name(signal_number)
        if cause in _CRASH_WORDING:
            what += f" ({signal_name(signal_number)})"
    if exit_status is not None:
        metadata[CRASH_EXIT_STATUS_KEY] = str(exit_status)
    return ORSError(
        errors_pb2.ERROR_REASON_ENVIRONMENT_CRASHED,
        f"the environment's worker process {what}; the episode's state is lost: start a new episode",
        metadata,
    )


def environment_crashed_from_exitcode(exitcode: int, cause: Optional[str] = None) -> ORSError:
    """`environment_crashed` from a process's exit code as multiprocessing's
    `Process.exitcode` and subprocess's `returncode` give it (-N: killed by
    signal N). `cause` defaults to `signal` or `exited` by that code; the
    server passes its own when it did the killing (`tool_timeout`, ...)."""
    if exitcode < 0:
        return environment_crashed(cause or CRASH_CAUSE_SIGNAL, signal_number=-exitcode)
    return environment_crashed(cause or CRASH_CAUSE_EXITED, exit_status=exitcode)


# Refusals that say what is valid. Each starts with the reference servers' own
# words (`Invalid split`, `Invalid index`, `Active environment not found`,
# `unknown environment 'x'`), which clients and scripts may look for, and adds
# the specifics after them (docs/http-bridge.md, "Differences").


def unknown_environment(name: str, hosted: Sequence[str]) -> str:
    """The text of a refusal naming an environment this server does not host."""
    return f"unknown environment {name!r}; this server hosts: {', '.join(hosted)}"


def invalid_split(split: str, env_name: str, splits: Sequence[str]) -> str:
    return f"Invalid split: {split!r} is not a split of {env_name} (its splits: {', '.join(splits) or 'none'})"


def invalid_index(index: int, split: str, num_tasks: Optional[int]) -> str:
    """`num_tasks` None: the split's size could not be learned (its environment's `num_tasks` failed)."""
    if num_tasks is None:
        return f"Invalid index: {index} is not a task of split {split!r}"
    if num_tasks == 0:
        return f"Invalid index: split {split!r} has no tasks"
    return (f"Invalid index: {index} is out of range for split {split!r}, which has {num_tasks} "
            f"task{'s' if num_tasks != 1 else ''} (0 to {num_tasks - 1}, or -{num_tasks} to -1 from the end)")


def invalid_index_range(split: str, num_tasks: Optional[int]) -> str:
    if num_tasks is None:
        return f"Invalid index range for split {split!r}"
    return f"Invalid index range for split {split!r}, which has {num_tasks} task{'s' if num_tasks != 1 else ''}"


def session_not_found(session_id: str) -> ORSError:
    """No episode lives (or lingers) under `session_id`."""
    return ORSError(errors_pb2.ERROR_REASON_SESSION_NOT_FOUND,
                    f"Active environment not found: no open episode has session id {session_id!r}")


def message_too_large(what: str, size_bytes: int, limit_bytes: int) -> ORSError:
    """An answer (`what`) of `size_bytes` over the message limit."""
    return ORSError(
        errors_pb2.ERROR_REASON_MESSAGE_TOO_LARGE,
        f"{what} is {size_bytes} bytes, over the server's message limit of {limit_bytes} bytes",
        {"size_bytes": str(size_bytes), "limit_bytes": str(limit_bytes)},
    )


def trailing_metadata(error: ORSError) -> tuple[tuple[str, str | bytes], ...]:
    """The trailing metadata of a failed RPC: the reason as `ors-error-reason`,
    the whole error as a google.rpc.Status with one ErrorInfo in
    `grpc-status-details-bin`, and `retry-after` when the server is full, draining, or the
    environment still starting."""
    metadata = {key: bounded_text(value, MAX_ERROR_METADATA_BYTES) for key, value in error.metadata.items()}
    retry_after_s = RETRY_AFTER_S.get(error.reason)
    if retry_after_s is not None:
        metadata["retry_after_s"] = str(retry_after_s)
    info = error_details_pb2.ErrorInfo(reason=error.reason_name, domain=ERROR_DOMAIN, metadata=metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=error.code.value[0], message=bounded_text(error.message), details=[detail])
    entries: list[tuple[str, str | bytes]] = [
        (ERROR_REASON_METADATA_KEY, error.reason_name),
        (STATUS_DETAILS_METADATA_KEY, status.SerializeToString()),
    ]
    if retry_after_s is not None:
        entries.append(("retry-after", str(retry_after_s)))
    return tuple(entries)


async def abort(context: grpc.aio.ServicerContext, error: ORSError) -> None:
    """End an RPC with `error`: its code and message (cut to
    MAX_ERROR_TEXT_BYTES), and its reason in the trailing metadata (see
    `trailing_metadata`). Raises, as `context.abort` does."""
    message = logged_bounded_text(error.message, error.reason_name)
    await context.abort(error.code, message, trailing_metadata=trailing_metadata(error))


def _mapping(reason_name: str | None) -> Mapping | None:
    """The row of an ORS reason's name (None: no reason, or one this table does not know)."""
    if not reason_name:
        return None
    try:
        return REASONS.get(errors_pb2.ErrorReason.Value(reason_name))
    except ValueError:
        return None


def http_status_for(code: grpc.StatusCode, reason_name: str | None) -> int:
    """The HTTP status of a failed RPC: by its ORS reason, else by its code."""
    mapping = _mapping(reason_name)
    return mapping.http_status if mapping is not None else GRPC_TO_HTTP.get(code, 500)


def ends_episode(reason_name: str | None) -> bool:
    """Whether a failed RPC's ORS reason says its episode is gone (`Mapping.ends_episode`)."""
    mapping = _mapping(reason_name)
    return mapping is not None and mapping.ends_episode
