"""The protocol's constants, defaults and metadata keys: each is defined here
once, and the runtime, the client, the doors and the CLI import it.

gRPC metadata keys are lowercase (HTTP/2 header names); the HTTP and MCP
doors read the same names case-insensitively, spelled as their HTTP headers
(`SESSION_ID_HEADER`, `API_KEY_HEADER`).
"""

from __future__ import annotations

__all__ = [
    "API_KEY_HEADER",
    "API_KEY_METADATA_KEY",
    "DEFAULT_DRAIN_TIMEOUT_S",
    "DEFAULT_KEEPALIVE_INTERVAL_S",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_RESULT_LINGER_S",
    "DEFAULT_SESSION_TIMEOUT_S",
    "DEFAULT_SETUP_WAIT_S",
    "DEFAULT_WARM_SETUP_TIMEOUT_S",
    "DEFAULT_WARM_TTL_S",
    "ERROR_REASON_METADATA_KEY",
    "IDEMPOTENCY_KEY_HEADER",
    "MAX_ERROR_TEXT_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_REQUEST_HEADERS",
    "MAX_REQUEST_HEAD_BYTES",
    "SESSION_ID_HEADER",
    "SESSION_ID_METADATA_KEY",
    "STATUS_DETAILS_METADATA_KEY",
]

#: The API key of every call but health checks (`--api-key`): the HTTP
#: header, and the gRPC metadata key (its lowercase).
API_KEY_HEADER = "X-API-Key"
API_KEY_METADATA_KEY = API_KEY_HEADER.lower()
#: The episode a call is about, as a routing key for proxies with session
#: affinity (nginx, HAProxy, Envoy hash on it): the HTTP header, and the gRPC
#: metadata key (its lowercase).
SESSION_ID_HEADER = "X-Session-ID"
SESSION_ID_METADATA_KEY = SESSION_ID_HEADER.lower()
#: The `ErrorReason` name of every deliberate failure, as trailing metadata.
ERROR_REASON_METADATA_KEY = "ors-error-reason"
#: The standard rich error model (`google.rpc.Status`), as trailing metadata.
STATUS_DETAILS_METADATA_KEY = "grpc-status-details-bin"
#: The HTTP door's header for exactly-once calls and scorings.
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"

#: Largest gRPC message (either way) and HTTP body, in bytes.
DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
#: Seconds without activity after which a session is reaped (the ORS spec's 15 minutes).
DEFAULT_SESSION_TIMEOUT_S = 900.0
#: Seconds a session call waits for the episode's setup before failing with
#: ENVIRONMENT_STARTING (HTTP 503), to be retried; openreward's 25 s.
DEFAULT_SETUP_WAIT_S = 25.0
#: Seconds between keepalives (an SSE `: ping` comment) while an HTTP door's
#: answer waits on a running tool: under the idle-read timeouts of common
#: proxies (nginx's and Envoy's 60 s, cloud load balancers' 30 s and up).
DEFAULT_KEEPALIVE_INTERVAL_S = 9.0
#: Seconds a finished tool call stays attachable by task id.
DEFAULT_RESULT_LINGER_S = 60.0
#: Seconds an episode prepared ahead (PrepareEpisodes) is held unclaimed once
#: its setup ended, before it is torn down.
DEFAULT_WARM_TTL_S = 300.0
#: Seconds a prepared episode's construction and `setup()` may take, counted
#: from the PrepareEpisodes that started it, before it is cancelled and torn
#: down (`--warm-setup-timeout`): a setup that hangs must not hold a place in
#: `--max-sessions` for good.
DEFAULT_WARM_SETUP_TIMEOUT_S = 600.0

#: Deepest nesting of objects and arrays in any user JSON value (a task spec,
#: a tool's input, a `detail`, a `metadata`), on every door and both ways.
#: Parsers and encoders that recurse fail near 1,000 levels; pydantic
#: refuses 255.
MAX_JSON_DEPTH = 128
#: Largest error text (UTF-8 bytes, marker included) in a gRPC status, its
#: `google.rpc.Status` copy, a `StepError`, a tool's or a scoring's failure
#: and an HTTP `detail`. The text travels twice in the trailers (percent-encoded
#: in `grpc-message`: up to 3 bytes per byte; base64 in
#: `grpc-status-details-bin`: 4/3), so 1 KiB keeps a whole status under 6 KiB,
#: within the 8 KiB soft metadata limit of grpc servers and clients.
MAX_ERROR_TEXT_BYTES = 1024

#: Largest HTTP request head (request line and every header line), in bytes,
#: on an HTTP port: room for a 64 KiB `X-Secrets` (about 86 KiB as base64)
#: beside the usual headers, while 24 hostile 15 MB heads at once cost the
#: server a few MB, not hundreds. Over it: 431 with a JSON `detail`.
MAX_REQUEST_HEAD_BYTES = 256 * 1024
#: Most header lines in one HTTP request head (431 over it).
MAX_REQUEST_HEADERS = 100

#: Seconds a draining server (SIGTERM, Drain) keeps serving the episodes it
#: holds before it ends them and exits (`--drain-timeout`).
DEFAULT_DRAIN_TIMEOUT_S = 300.0
