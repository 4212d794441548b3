"""The record of one episode (GetEpisodeRecord): its task, every tool call in
the order they started and totals, kept while the episode lives and, in
`EndedRecords`, for a while after it ended.

Bounded: the first `MAX_RECORDED_CALLS` calls are kept (the totals count
every call), an input over `MAX_RECORDED_INPUT_BYTES` of JSON is left out,
and outputs are never kept (only their size). Never secrets: the episode's
secret values are masked in every string of an input and in error texts.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Callable, Optional

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc.authoring.types import RunToolOutput
from ors_grpc.protocol import json_text
from ors_grpc.protocol.enums import RUN_TOOL_ERROR_REASON

__all__ = ["EndedRecords", "EpisodeRecorder", "MAX_ENDED_RECORDS", "MAX_RECORDED_CALLS", "MAX_RECORDED_INPUT_BYTES",
           "RecordedCall"]

#: Calls kept per episode (the first ones).
MAX_RECORDED_CALLS = 1000
#: Largest input kept, as JSON text.
MAX_RECORDED_INPUT_BYTES = 8 * 1024
#: Ended episodes whose record is kept at most (the latest), whatever their linger.
MAX_ENDED_RECORDS = 10_000

def _masked(value: Any, redact: Callable[[str], str]) -> Any:
    """`value` with every string in it (keys too) passed through `redact`."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(str(key)): _masked(item, redact) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_masked(item, redact) for item in value]
    return value


class RecordedCall:
    """One tool call as the record keeps it."""

    __slots__ = ("name", "input_json", "input_bytes", "started_at", "ended_at", "reward", "finished",
                 "refusal_reason", "error", "output_bytes")

    def __init__(self, name: str, input_json: Optional[str], input_bytes: int) -> None:
        self.name = name
        self.input_json = input_json
        self.input_bytes = input_bytes
        self.started_at = time.time()
        self.ended_at = 0.0
        self.reward: Optional[float] = None
        self.finished = False
        self.refusal_reason = types_pb2.RUN_TOOL_ERROR_REASON_UNSPECIFIED
        self.error = ""
        self.output_bytes = 0

    def to_proto(self) -> pb.ToolCallRecord:
        message = pb.ToolCallRecord(
            tool_name=self.name, input_omitted=self.input_json is None, input_bytes=self.input_bytes,
            finished=self.finished, refusal_reason=self.refusal_reason, error=self.error,
            started_at_unix_s=self.started_at, ended_at_unix_s=self.ended_at, output_bytes=self.output_bytes,
        )
        if self.input_json is not None:
            message.input.json = self.input_json
        if self.reward is not None:
            message.reward = self.reward
        return message


class EpisodeRecorder:
    """The record of one episode, filled in as its calls start and end."""

    __slots__ = ("env_name", "task_json", "toolset_name", "created_at", "_redact", "_masking", "_calls", "_started",
                 "_reward_sum", "_last_reward", "_finished")

    def __init__(self, env_name: str, task_spec: Any, toolset_name: Optional[str], redact: Callable[[str], str],
                 *, masking: bool = True, task_json: Optional[str] = None):
        """`masking=False`: the episode has no secrets (`redact` changes
        nothing), so inputs are written down without a walk through them.
        `task_json`: `task_spec` as JSON text already (the request's), kept as it is."""
        self.env_name = env_name
        self.task_json = json_text.dumps(task_spec) if task_json is None else task_json
        self.toolset_name = toolset_name
        self.created_at = time.time()
        self._redact = redact
        self._masking = masking
        self._calls: list[RecordedCall] = []
        self._started = 0
        self._reward_sum = 0.0
        self._last_reward: Optional[float] = None
        self._finished = False

    def call_started(self, name: str, tool_input: Any, input_json: Optional[str] = None) -> RecordedCall:
        """A new call's entry (kept in the record while under the cap).
        `input_json`: `tool_input` as JSON text already (the request's, which
        kept json_text's rules), kept as it is unless secrets must be masked."""
        if self._masking:
            tool_input, name, input_json = _masked(tool_input, self._redact), self._redact(name), None
        text = json_text.dumps(tool_input) if input_json is None else input_json
        size = len(text) if text.isascii() else len(text.encode("utf-8", errors="surrogatepass"))
        call = RecordedCall(name, text if size <= MAX_RECORDED_INPUT_BYTES else None, size)
        self._started += 1
        if len(self._calls) < MAX_RECORDED_CALLS:
            self._calls.append(call)
        return call

    def call_returned(self, call: RecordedCall, result: RunToolOutput, output_bytes: int) -> None:
        """The tool returned (or the call was refused) with `result`, of `output_bytes` as a message."""
        call.ended_at = time.time()
        call.output_bytes = output_bytes
        outcome = result.root
        if outcome.ok:
            call.reward = outcome.output.reward
            call.finished = outcome.output.finished
            if call.reward is not None:
                self._reward_sum += call.reward
                self._last_reward = call.reward
            self._finished = self._finished or call.finished
        else:
            call.refusal_reason = RUN_TOOL_ERROR_REASON.value_or(outcome.reason,
                                                                 types_pb2.RUN_TOOL_ERROR_REASON_UNSPECIFIED)
            call.error = self._redact(outcome.error)

    def call_failed(self, call: RecordedCall, message: str) -> None:
        """The tool raised, timed out or was stopped: `message` (its secrets already masked)."""
        call.ended_at = time.time()
        call.error = message

    def to_proto(self, session_id: str, *, ended: int = pb.EPISODE_END_UNSPECIFIED, ended_at: float = 0.0,
                 setup_error: str = "") -> pb.EpisodeRecord:
        record = pb.EpisodeRecord(
            session_id=session_id, env_name=self.env_name, task=types_pb2.JsonValue(json=self.task_json),
            created_at_unix_s=self.created_at, calls=[call.to_proto() for call in self._calls],
            calls_dropped=self._started - len(self._calls),
            totals=pb.EpisodeTotals(calls=self._started, reward_sum=self._reward_sum, finished=self._finished),
            ended=ended, ended_at_unix_s=ended_at, setup_error=setup_error,
        )
        if self.toolset_name is not None:
            record.toolset_name = self.toolset_name
        if self._last_reward is not None:
            record.totals.last_reward = self._last_reward
        return record


class _Ended:
    __slots__ = ("recorder", "ended", "ended_at", "setup_error", "expires")

    def __init__(self, recorder: EpisodeRecorder, ended: int, setup_error: str, expires: float) -> None:
        self.recorder = recorder
        self.ended = ended
        self.ended_at = time.time()
        self.setup_error = setup_error
        self.expires = expires


class EndedRecords:
    """Records of ended episodes, kept `linger_s` after the end (the latest
    `MAX_ENDED_RECORDS` at most). Ends arrive in time order, so the oldest
    is always first: expiry needs no timers."""

    def __init__(self, linger_s: float, max_records: int = MAX_ENDED_RECORDS) -> None:
        self._linger_s = linger_s
        self._max_records = max_records
        self._records: OrderedDict[str, _Ended] = OrderedDict()

    def add(self, session_id: str, recorder: EpisodeRecorder, ended: int, setup_error: str = "") -> None:
        self._records.pop(session_id, None)
        self._records[session_id] = _Ended(recorder, ended, setup_error, time.monotonic() + self._linger_s)
        self._expire()

    def find(self, session_id: str) -> Optional[pb.EpisodeRecord]:
        self._expire()
        entry = self._records.get(session_id)
        if entry is None:
            return None
        return entry.recorder.to_proto(session_id, ended=entry.ended, ended_at=entry.ended_at,
                                       setup_error=entry.setup_error)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._records:
            first = next(iter(self._records.values()))
            if first.expires > now and len(self._records) <= self._max_records:
                return
            self._records.popitem(last=False)
