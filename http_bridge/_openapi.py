"""The OpenAPI 3.1 description of the ORS HTTP API as this bridge serves it: `/openapi.json`.

One place to keep in sync with the routes in `app.py`: the `OPERATIONS`
table below (`tests/bridge/test_openapi.py` fails when a served route is not
in it, or a documented one is not served). Request body schemas are not
written here: they come from the pydantic models that validate the bodies
(`_convert.SplitBody`, ...), so they cannot drift. Response schemas are the
ORS data types as the reference server writes them.

`/openapi.json` answers without an API key and without asking the backend,
as the reference (FastAPI) serves it: the document describes the API, it
holds no data. The pages (`/docs`, the playground at `/`) are `_static`'s.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from aiohttp import web

from ors_grpc._version import __version__
from ors_grpc.protocol.constants import API_KEY_HEADER, SESSION_ID_HEADER

from . import _convert as convert

__all__ = ["OPERATIONS", "Operation", "openapi_document", "routes"]

SSE_GRAMMAR = """\
Server-Sent Events, one event per `event: NAME` line, one or more `data: ...` lines
(a line break in the data becomes a new `data:` line; join them with "\\n") and a blank line.
Comment lines (`: ping`) are keepalives, sent at least every 10 s while the tool runs."""

CALL_EVENTS = """\
1. `task_id`: the call's task id (32 hex characters); keep it to reattach.
2. zero or more `chunk`, then one `end`: the compact JSON of a `RunToolOutput`, cut into
   pieces of 4096 characters; concatenate the data of every `chunk` and the `end` in order.
3. or, instead of 2, one `error`: a message (the tool raised; or `unknown task_id` on a reattach).
   An `error` that stands for a status carries its reason in a `reason:` line, which SSE
   parsers that do not know it skip: the call's answer was over the server's message limit
   (`ERROR_REASON_MESSAGE_TOO_LARGE`; the episode lives on), or the environment's process died
   under the call (`ERROR_REASON_ENVIRONMENT_CRASHED`; before the first byte the answer is its
   HTTP 410 itself, since the episode is gone).

An unknown tool name or input that fails the tool's schema is not an `error`: it is an `end`
with `{"ok": false, "error": "..."}`. A stream that ends without `end` or `error` (the backend
went away) is resumed by sending the same body again with `task_id` set; the tool does not run
twice, and a finished result stays available for at least 60 s."""


# --------------------------------------------------------------------------
# Schemas (JSON Schema 2020-12, as OpenAPI 3.1 uses)
# --------------------------------------------------------------------------


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _idempotency_key_header(what: str, instead_of: str, reused_for: str) -> dict[str, Any]:
    """The `Idempotency-Key` header parameter of a task route (/call, /score_group)."""
    return {
        "name": "Idempotency-Key", "in": "header", "required": False,
        "description": f"Extension: the {what}'s task id, so a retried POST with the same key attaches "
                       f"to the first run instead of {instead_of} (422 when the key names {reused_for}).",
        # The key is 1 to 128 characters; the draft's quotes come on top.
        "schema": {"type": "string", "minLength": 1, "maxLength": 130},
    }


_NULLABLE_OBJECT = {"type": ["object", "null"]}
_USER_OBJECT = {"type": "object", "description": "Environment-defined JSON, passed through losslessly."}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["detail"],
        "properties": {"detail": {"type": "string", "description": "What went wrong."}},
    },
    "Status": {"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}},
    "Version": {"type": "object", "required": ["version"], "properties": {"version": {"type": "string"}}},
    "SessionId": {"type": "object", "required": ["sid"], "properties": {"sid": {"type": "string"}}},
    "TextBlock": {
        "type": "object",
        "required": ["text", "detail", "type"],
        "properties": {"text": {"type": "string"}, "detail": _NULLABLE_OBJECT, "type": {"const": "text"}},
    },
    "ImageBlock": {
        "type": "object",
        "required": ["data", "mimeType", "detail", "type"],
        "properties": {
            "data": {"type": "string", "contentEncoding": "base64"},
            "mimeType": {"type": "string"},
            "detail": _NULLABLE_OBJECT,
            "type": {"const": "image"},
        },
    },
    "Block": {
        "oneOf": [_ref("TextBlock"), _ref("ImageBlock")],
        "discriminator": {
            "propertyName": "type",
            "mapping": {"text": "#/components/schemas/TextBlock", "image": "#/components/schemas/ImageBlock"},
        },
    },
    "Blocks": {"type": "array", "items": _ref("Block")},
    "ToolSpec": {
        "type": "object",
        "required": ["name", "description", "input_schema"],
        "properties": {
            "name": {"type": "string"},
            "description": {"type": "string"},
            "input_schema": {**_NULLABLE_OBJECT, "description": "A JSON Schema; null for a tool without parameters."},
        },
    },
    "TerminalToolSpec": {
        "type": "object",
        "required": ["name", "arg", "description"],
        "properties": {"name": {"type": "string"}, "arg": {"type": "string"}, "description": {"type": "string"}},
    },
    "ListToolsOutput": {
        "type": "object",
        "required": ["tools", "terminal_tool", "supports_score_group", "message_block_types"],
        "properties": {
            "tools": {"type": "array", "items": _ref("ToolSpec")},
            "terminal_tool": {
                "oneOf": [_ref("TerminalToolSpec"), {"type": "null"}],
                "description": "openreward: the tool the agent's final message goes to; not in `tools`.",
            },
            "supports_score_group": {"type": "boolean"},
            "message_block_types": {"type": "array", "items": {"type": "string"}},
        },
    },
    "Message": {
        "type": "object",
        "required": ["role", "blocks", "detail"],
        "properties": {
            "role": {"enum": ["system", "user", "assistant"]},
            "blocks": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
                "type": {"enum": ["text", "image", "reasoning", "tool_call", "tool_result"]}}}},
            "detail": _NULLABLE_OBJECT,
        },
    },
    "ScoreGroupOutput": {
        "description": "The payload of a group scoring's `chunk`/`end` events: one score per candidate.",
        "type": "object",
        "required": ["scores"],
        "properties": {"scores": {"type": "array", "items": {
            "type": "object", "required": ["reward", "metadata"],
            "properties": {"reward": {"type": "number"}, "metadata": _NULLABLE_OBJECT}}}},
    },
    "ToolOutput": {
        "type": "object",
        "required": ["blocks", "metadata", "reward", "finished"],
        "properties": {
            "blocks": _ref("Blocks"),
            "metadata": _NULLABLE_OBJECT,
            "reward": {"type": ["number", "null"]},
            "finished": {"type": "boolean"},
        },
    },
    "RunToolOutput": {
        "description": "The payload of a tool call's `chunk`/`end` events.",
        "oneOf": [
            {
                "type": "object",
                "required": ["ok", "output"],
                "properties": {"ok": {"const": True}, "output": _ref("ToolOutput")},
            },
            {
                "type": "object",
                "required": ["ok", "error"],
                "properties": {
                    "ok": {"const": False},
                    "error": {"type": "string"},
                    "reason": {"enum": ["not_found", "name_collision", "input_validation", "episode_finished",
                                        None]},
                },
            },
        ],
    },
    "Split": {
        "type": "object",
        "required": ["name", "type"],
        "properties": {"name": {"type": "string"}, "type": {"enum": ["train", "validation", "test"]}},
    },
    "Task": _USER_OBJECT,
    "TaskList": {
        "type": "object",
        "required": ["tasks", "env_name"],
        "properties": {"tasks": {"type": "array", "items": _ref("Task")}, "env_name": {"type": "string"}},
    },
    "OneTask": {
        "type": "object",
        "required": ["task", "env_name"],
        "properties": {"task": _ref("Task"), "env_name": {"type": "string"}},
    },
    "NumTasks": {"type": "object", "required": ["num_tasks"], "properties": {"num_tasks": {"type": "integer"}}},
    "ServerStats": {
        "type": "object",
        "required": ["environments", "window_seconds"],
        "properties": {
            "environments": {"type": "array", "items": _ref("EnvironmentStats"),
                             "description": "One per hosted environment, in `/list_environments` order."},
            "window_seconds": {"type": "number", "description": "How far back rates and latencies look."},
        },
    },
    "EnvironmentStats": {
        "type": "object",
        "required": ["env_name", "open_sessions", "prepared_episodes", "tool_calls_in_flight",
                     "tool_calls_per_second", "call_latency_p50_ms", "call_latency_p99_ms", "recent_errors"],
        "properties": {
            "env_name": {"type": "string"},
            "open_sessions": {"type": "integer", "description": "Episodes with a session now."},
            "prepared_episodes": {"type": "integer", "description": "Warm episodes not yet claimed."},
            "tool_calls_in_flight": {"type": "integer"},
            "tool_calls_per_second": {"type": "number", "description": "Calls that ended in the window, per second."},
            "call_latency_p50_ms": {"type": ["number", "null"],
                                    "description": "null when no call ended in the window."},
            "call_latency_p99_ms": {"type": ["number", "null"]},
            "recent_errors": {
                "type": "array", "description": "The last errors of the environment's code, newest first.",
                "items": {
                    "type": "object", "required": ["time_unix_ms", "source", "message"],
                    "properties": {
                        "time_unix_ms": {"type": "integer"},
                        "source": {"type": "string", "description": "`setup`, or `tool NAME`."},
                        "message": {"type": "string", "description": "As the client was told it (secrets masked)."},
                    },
                },
            },
        },
    },
    "EpisodeRecord": {
        "type": "object",
        "description": "What happened in an episode (proto `EpisodeRecord`): at most 1,000 calls, the first; "
                       "inputs over 8 KiB left out; secret values masked; never the outputs.",
        "required": ["session_id", "env_name", "task", "calls", "calls_dropped", "totals", "ended"],
        "properties": {
            "session_id": {"type": "string"},
            "env_name": {"type": "string"},
            "task": _ref("Task"),
            "toolset_name": {"type": ["string", "null"]},
            "created_at_unix_s": {"type": "number"},
            "calls": {"type": "array", "items": {
                "type": "object",
                "required": ["tool_name", "input", "reward", "finished", "refusal_reason", "error",
                             "started_at_unix_s", "ended_at_unix_s", "output_bytes"],
                "properties": {
                    "tool_name": {"type": "string"},
                    "input": {"type": ["object", "null"], "description": "null when `input_omitted`."},
                    "input_omitted": {"type": "boolean"},
                    "input_bytes": {"type": "integer"},
                    "reward": {"type": ["number", "null"]},
                    "finished": {"type": "boolean"},
                    "refusal_reason": {"enum": ["not_found", "name_collision", "input_validation",
                                                "episode_finished", None]},
                    "error": {"type": ["string", "null"], "description": "A refusal's text, or what the tool raised."},
                    "started_at_unix_s": {"type": "number"},
                    "ended_at_unix_s": {"type": ["number", "null"], "description": "null while it runs."},
                    "output_bytes": {"type": "integer", "description": "Size of the result message, not kept."},
                },
            }},
            "calls_dropped": {"type": "integer", "description": "Calls past the cap (the totals include them)."},
            "totals": {"type": "object", "required": ["calls", "reward_sum", "last_reward", "finished"],
                       "properties": {"calls": {"type": "integer"}, "reward_sum": {"type": "number"},
                                      "last_reward": {"type": ["number", "null"]}, "finished": {"type": "boolean"}}},
            "ended": {"enum": ["deleted", "reaped", "server_stopped", None], "description": "null while live."},
            "ended_at_unix_s": {"type": ["number", "null"]},
            "setup_error": {"type": ["string", "null"]},
        },
    },
    "Preparing": {
        "type": "object",
        "required": ["preparing", "ttl_seconds"],
        "properties": {
            "preparing": {"type": "integer", "description": "Episodes now being prepared."},
            "ttl_seconds": {"type": "number", "description": "How long a ready one waits to be claimed."},
        },
    },
    "Cancelled": {
        "type": "object",
        "required": ["cancelled"],
        "properties": {"cancelled": {"type": "integer", "description": "Held episodes cancelled."}},
    },
}

#: Request bodies: the validating models' own schemas.
BODY_MODELS = {
    "SplitBody": convert.SplitBody,
    "TaskBody": convert.TaskBody,
    "TaskRangeBody": convert.TaskRangeBody,
    "CreateBody": convert.CreateBody,
    "CallBody": convert.CallBody,
    "PrepareBody": convert.PrepareBody,
    "CancelPreparedBody": convert.CancelPreparedBody,
    "ScoreGroupBody": convert.ScoreGroupBody,
}


# --------------------------------------------------------------------------
# Operations: one row per served method + path
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    operation_id: str
    summary: str
    tag: str
    #: The JSON (or SSE) answer: a schema name, or a schema.
    response: Any = None
    body: Optional[str] = None
    session: bool = False
    #: Error statuses besides the ones every route may answer.
    errors: tuple[int, ...] = ()
    description: str = ""
    sse: bool = False
    #: Served by the bridge itself: no API key, no backend call.
    public: bool = False
    #: The media types of a non-JSON answer (a page, its files).
    files: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


_SESSION_ERRORS = (400, 404, 410, 500, 503)
_FILE_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"},
              "description": "The file's name."}

OPERATIONS: tuple[Operation, ...] = (
    Operation("get", "/health", "health", "Liveness of the bridge and its backend", "discovery", "Status",
              public=True, description="Needs no API key. 503 while the gRPC backend cannot be reached."),
    Operation("get", "/version", "version", "The server's package version", "discovery", "Version"),
    Operation("get", "/list_environments", "list_environments", "Names of the hosted environments",
              "discovery", {"type": "array", "items": {"type": "string"}},
              description="Lower-cased class names, in registration order; the first is the default."),
    Operation("get", "/{env}/tools", "list_tools", "The environment's shared tools", "discovery",
              "ListToolsOutput", errors=(404,)),
    Operation("get", "/{env}/splits", "list_splits", "The environment's splits", "discovery",
              {"type": "array", "items": _ref("Split")}, errors=(404,)),
    Operation("post", "/{env}/tasks", "list_tasks", "Every task of a split", "discovery", "TaskList",
              body="SplitBody", errors=(400, 404),
              description="400 `Invalid split`, or when the environment only supports index access."),
    Operation("post", "/{env}/num_tasks", "num_tasks", "How many tasks a split has", "discovery", "NumTasks",
              body="SplitBody", errors=(400, 404)),
    Operation("post", "/{env}/task", "get_task", "One task by split and index", "discovery", "OneTask",
              body="TaskBody", errors=(400, 404), description="400 `Invalid split` or `Invalid index`."),
    Operation("post", "/{env}/get_task", "get_task_alias", "Alias of /{env}/task (the spec's name)",
              "discovery", "OneTask", body="TaskBody", errors=(400, 404)),
    Operation("post", "/{env}/task_range", "get_task_range", "Tasks [start, stop) of a split", "discovery",
              "TaskList", body="TaskRangeBody", errors=(400, 404),
              description="Python slice semantics: null means the end, negatives count from the end, clamped."),
    Operation("post", "/{env}/get_task_range", "get_task_range_alias",
              "Alias of /{env}/task_range (the spec's name)", "discovery", "TaskList",
              body="TaskRangeBody", errors=(400, 404)),
    Operation("post", "/create_session", "create_session", "A new session id", "sessions", "SessionId", sse=True,
              description="With `Accept: text/event-stream` (both Python clients) the answer is SSE: "
                          "`event: task_id` / `data: <uuid4>`, then `event: end` / `data: ` (empty). "
                          "Otherwise JSON `{\"sid\": ...}`."),
    Operation("post", "/create", "create_episode", "Start an episode in the session", "sessions", "SessionId",
              body="CreateBody", session=True, errors=(400, 404, 429),
              description="Answers at once; the environment is built and set up in the background (session "
                          "calls wait for it). Exactly one of `task_spec` or `split` + `index` (422 otherwise). "
                          "Secrets come from the body's `secrets` and the `X-Secrets` header (base64 of JSON "
                          "`{\"NAME\": {\"value\": \"...\"}}`), merged, the body's winning; they are never "
                          "logged or echoed. 400 `Session already exists`; 429 when the server is at its "
                          "session limit.",
              extra={"parameters": [{
                  "name": "X-Secrets", "in": "header", "required": False,
                  "description": "base64 of JSON `{\"NAME\": {\"value\": \"...\"}}` (or `{\"NAME\": \"...\"}`).",
                  "schema": {"type": "string"},
              }]}),
    Operation("post", "/ping", "ping", "Keep the session alive", "sessions", "Status", session=True,
              errors=(400, 404), description="404 `Active environment not found` for a session without an episode."),
    Operation("post", "/delete", "delete_episode", "End the session's episode (teardown)", "sessions",
              "SessionId", session=True, errors=(400,), description="Idempotent: always 200."),
    Operation("post", "/delete_session", "delete_session", "Release the session id", "sessions", "SessionId",
              session=True, errors=(400,), description="Idempotent: always 200; also ends the session's episode."),
    Operation("get", "/{env}/prompt", "get_prompt", "The episode's prompt", "episode", "Blocks", session=True,
              errors=_SESSION_ERRORS, description="Waits for setup. Any `{env}` is accepted."),
    Operation("get", "/{env}/task_tools", "list_task_tools", "Shared tools, then the task's own", "episode",
              "ListToolsOutput", session=True, errors=_SESSION_ERRORS,
              description="Waits for setup. Any `{env}` is accepted."),
    Operation("post", "/{env}/call", "call_tool", "Run a tool (or reattach by task_id)", "episode",
              "RunToolOutput", body="CallBody", session=True, errors=_SESSION_ERRORS, sse=True,
              description="Waits for setup; errors before the call starts (unknown session 404, deleted or its "
                          "environment's process dead 410, setup failed 500) are HTTP statuses, later ones are SSE `error` events.\n\n"
                          + SSE_GRAMMAR + "\n\nEvents:\n\n" + CALL_EVENTS,
              extra={"parameters": [_idempotency_key_header("call", "running the tool again",
                                                             "another tool or input")]}),
    Operation("get", "/{env}/messages", "get_messages", "openreward: the prompt as messages", "episode",
              {"type": "array", "items": _ref("Message")}, session=True, errors=_SESSION_ERRORS,
              description="Waits for setup. An environment without `get_messages` answers its prompt as one "
                          "user message."),
    Operation("post", "/{env}/score_group", "score_group", "openreward: score a group of candidates", "episode",
              "ScoreGroupOutput", body="ScoreGroupBody", session=True, errors=_SESSION_ERRORS + (422,), sse=True,
              description="SSE exactly as `/{env}/call` (task id, `chunk`*/`end` or `error`, keepalive, reattach "
                          "by `task_id`); the payload is one score per candidate. 404 before the stream when the "
                          "environment does not implement `score_group`.",
              extra={"parameters": [_idempotency_key_header("scoring", "scoring again",
                                                             "other candidates, or a tool call")]}),
    Operation("post", "/{env}/prepare", "prepare_episodes", "Extension: set episodes up ahead (warm episodes)",
              "extensions", "Preparing", body="PrepareBody", errors=(400, 404, 429, 503),
              description="Not in ORS. Each entry has the server construct the environment and run `setup()` "
                          "in the background; a later `/create` of the same task, secrets and API key claims "
                          "one at once. Unclaimed ones are torn down after `--warm-ttl` seconds; one whose "
                          "setup has not ended `--warm-setup-timeout` seconds after its prepare is cancelled. With "
                          f"`session_ids` (one per entry), or an `{SESSION_ID_HEADER}` header (one entry), each is "
                          "reserved for the `/create` under that session id; behind a load balancer hashing "
                          f"`{SESSION_ID_HEADER}`, send one request per id with the header. 503 while the server "
                          "drains.",
              extra={"parameters": [{
                  "name": SESSION_ID_HEADER, "in": "header", "required": False, "schema": {"type": "string"},
                  "description": "Reserve the one episode of this request for the `/create` under this id.",
              }]}),
    Operation("post", "/{env}/cancel_prepared", "cancel_prepared_episodes",
              "Extension: cancel episodes set up ahead (warm episodes)", "extensions", "Cancelled",
              body="CancelPreparedBody", errors=(400, 404, 422),
              description="Not in ORS. Cancels held (unclaimed) episodes prepared with the same secrets and API "
                          "key: one of each task given, or every one of the environment with no task given; a "
                          "running setup is cancelled, `teardown()` runs, and each frees its place in "
                          "`--max-sessions`."),
    Operation("get", "/{env}/episode", "episode_record", "Extension: what happened in the episode", "extensions",
              "EpisodeRecord", session=True, errors=(400, 404),
              description="Not in ORS. The task, every tool call in order (name, input, reward, finished, "
                          "refusal or error, times, output size; never the output) and totals, for a live "
                          "episode and for an ended one during the linger (60 s by default); 404 after. "
                          "Needs no finished setup. Any `{env}` is accepted."),
    Operation("get", "/openapi.json", "openapi", "This document", "meta", {"type": "object"}, public=True,
              description="Needs no API key, as in the reference server."),
    Operation("get", "/server_stats", "server_stats", "Extension: the server's counters per environment",
              "extensions", "ServerStats",
              description="Not in ORS; read-only. Open sessions, prepared episodes, tool calls in flight, tool "
                          "calls per second and their p50/p99 latency over the last `window_seconds`, and the "
                          "last errors of the environment's code, as the gRPC backend counts them "
                          "(`GetServerStats`). The playground's live view polls it."),
    Operation("get", "/docs", "docs", "Swagger UI for this document", "meta", public=True, files=("text/html",),
              description="Needs no API key. Every file is served by the bridge (no CDN): it works offline."),
    Operation("get", "/docs/{name}", "docs_file", "A file of Swagger UI", "meta", public=True,
              files=("text/javascript", "text/css"), errors=(404,), extra={"parameters": [_FILE_NAME]}),
    Operation("get", "/", "playground", "The playground: play an environment in a browser", "meta", public=True,
              files=("text/html",),
              description="Needs no API key (the page asks for it when the server has one, and keeps it in "
                          "memory). It uses only the routes of this document."),
    Operation("get", "/playground/{name}", "playground_file", "A file of the playground", "meta", public=True,
              files=("text/javascript", "text/css"), errors=(404,), extra={"parameters": [_FILE_NAME]}),
)


# --------------------------------------------------------------------------
# The document
# --------------------------------------------------------------------------

_STATUS_TEXT = {
    400: "Bad request (see `detail`)",
    401: "Missing or wrong API key (when the server requires one)",
    404: "Unknown environment, or no active episode for the session (or no such file)",
    410: ("The episode is gone: the session was deleted while the call waited for setup, or the process "
          "running its environment's code died (a crash, a signal, or killed for a tool timeout, a stall or "
          "its memory limit; `detail` says which). Start a new episode; do not retry the call"),
    413: "Request body over the size limit",
    422: "The body is not JSON, or not of the expected shape; `detail` names the field",
    429: "Too many sessions or requests; retry after `Retry-After`",
    500: "The environment's code raised (a failed setup: its message), or an internal error",
    503: "The gRPC backend is unavailable; retry after `Retry-After`",
}

_INFO_DESCRIPTION = """\
The Open Reward Standard (ORS) HTTP/SSE API, as served by `http_bridge` in front of the ORS gRPC service.
Every error is JSON `{"detail": "..."}` with its status.

**Default environment**: a path whose first segment is neither a root route nor a hosted environment is
answered `308 Permanent Redirect` to `/{first environment}{path}` (query kept), so `/tools`, `/prompt`,
`/call` ... reach the default environment. Environment names match case-insensitively.

**Sessions**: session-scoped routes need the `X-Session-ID` header (400 without it); any string is
accepted as a session id. Sessions expire after 15 minutes without a session call or `/ping`.

**Auth**: when the server is given an API key, every route but `/health`, `/openapi.json` and the pages
(`/docs`, the playground at `/`, and their files) needs it in `X-API-Key` (or `Authorization: Bearer`);
401 otherwise. Without a key nothing is checked.

**Tracing**: a W3C `traceparent` header continues into the server's OpenTelemetry spans when tracing is on."""


def _error_response(status: int) -> dict[str, Any]:
    return {"description": _STATUS_TEXT[status], "content": {"application/json": {"schema": _ref("Error")}}}


def _schema(response: Any) -> Any:
    return _ref(response) if isinstance(response, str) else response


#: Routes answered by a task stream (`/call`'s SSE grammar), with an example `end` payload.
TASK_STREAMS = {
    "/{env}/call": '{"ok":true,"output":{"blocks":[{"text":"correct","detail":null,"type":"text"}],'
                   '"metadata":null,"reward":1.0,"finished":true}}',
    "/{env}/score_group": '{"scores":[{"reward":1.0,"metadata":null},{"reward":0.0,"metadata":null}]}',
}


def _task_stream_response(op: Operation) -> dict[str, Any]:
    """An SSE task stream: `task_id`, then `chunk`* + `end` (payload `op.response`) or `error`."""
    return {
        "description": f"An SSE stream: `task_id`, then `chunk`* + `end` (a {op.response}) or `error`.",
        "headers": {
            "Cache-Control": {"schema": {"const": "no-cache"}},
            "X-Accel-Buffering": {"schema": {"const": "no"}},
        },
        "content": {
            "text/event-stream": {
                "schema": {"type": "string", "description": SSE_GRAMMAR},
                "x-sse-events": {"task_id": {"type": "string"}, "chunk": {"type": "string"},
                                 "end": {"type": "string", "contentMediaType": "application/json",
                                         "contentSchema": _ref(op.response)},
                                 "error": {"type": "string"}},
                "example": "event: task_id\ndata: 9b2f0c6e4d1a4e0f8a7b3c2d1e0f9a8b\n\n"
                           f"event: end\ndata: {TASK_STREAMS[op.path]}\n\n",
            },
        },
    }


def _ok_response(op: Operation) -> dict[str, Any]:
    if op.files:
        return {"description": "A page or a file of one",
                "content": {media_type: {"schema": {"type": "string"}} for media_type in op.files}}
    if op.path in TASK_STREAMS:
        return _task_stream_response(op)
    content: dict[str, Any] = {"application/json": {"schema": _schema(op.response)}}
    if op.sse:  # /create_session
        content["text/event-stream"] = {
            "schema": {"type": "string", "description": SSE_GRAMMAR},
            "x-sse-events": {"task_id": {"type": "string", "description": "the new session id"},
                             "end": {"type": "string", "const": ""}},
            "example": "event: task_id\ndata: 3f1c2a4e-8d6b-4c1e-9a7f-2b5d8e0c4a1f\n\nevent: end\ndata: \n\n",
        }
    return {"description": "OK", "content": content}


def _operation(op: Operation) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = []
    if "{env}" in op.path:
        parameters.append({"$ref": "#/components/parameters/Env"})
    if op.session:
        parameters.append({"$ref": "#/components/parameters/SessionId"})
    parameters.extend(op.extra.get("parameters", ()))
    responses: dict[str, Any] = {"200": _ok_response(op)}
    statuses = set(op.errors)
    if not op.public:
        statuses |= {401, 500, 503}
    if op.body:
        statuses |= {413, 422}
    for status in sorted(statuses):
        responses[str(status)] = {"$ref": f"#/components/responses/Error{status}"}
    document: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [op.tag],
        "responses": responses,
    }
    if op.description:
        document["description"] = op.description
    if parameters:
        document["parameters"] = parameters
    if op.body:
        document["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(op.body)}},
        }
    if op.public:
        document["security"] = []
    return document


@functools.lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    """The whole OpenAPI 3.1 document (built once; treat it as read-only)."""
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    schemas = dict(SCHEMAS)
    for name, model in BODY_MODELS.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))  # nested models (a message's blocks) are components too
        schemas[name] = schema
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Open Reward Standard (ORS) HTTP API",
            "version": __version__,
            "description": _INFO_DESCRIPTION,
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": [
            {"name": "discovery", "description": f"No session needed (an `{SESSION_ID_HEADER}` header is tolerated)."},
            {"name": "sessions", "description": "Session ids and episodes."},
            {"name": "episode", "description": "Calls within an episode; they wait for setup."},
            {"name": "extensions", "description": "Not in ORS: additions of this server."},
            {"name": "meta", "description": "This description, and the pages the bridge serves."},
        ],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": {f"Error{status}": _error_response(status) for status in sorted(_STATUS_TEXT)},
            "parameters": {
                "Env": {
                    "name": "env", "in": "path", "required": True, "schema": {"type": "string"},
                    "description": "An environment name (case-insensitive). Session-scoped routes accept any.",
                },
                "SessionId": {
                    "name": SESSION_ID_HEADER, "in": "header", "required": True, "schema": {"type": "string"},
                    "description": "The session (from `/create_session`, or any string of the client's).",
                },
            },
            "securitySchemes": {
                "ApiKey": {"type": "apiKey", "in": "header", "name": API_KEY_HEADER,
                           "description": "Only when the server was started with an API key."},
                "Bearer": {"type": "http", "scheme": "bearer",
                           "description": "The same key as `Authorization: Bearer <key>`."},
            },
        },
        # Either carrier, or none when the server requires no key.
        "security": [{"ApiKey": []}, {"Bearer": []}, {}],
    }


# --------------------------------------------------------------------------
# Handlers
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _document_text() -> str:
    return json.dumps(openapi_document(), ensure_ascii=False, separators=(",", ":"))


async def openapi_json(request: web.Request) -> web.Response:
    return web.Response(text=_document_text(), content_type="application/json")


def routes() -> list[web.RouteDef]:
    """The route of this module, for the app's route table."""
    return [web.get("/openapi.json", openapi_json)]
