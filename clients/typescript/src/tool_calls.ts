// The two kinds of work with a task id: tool calls (CallTool) and group
// scorings (ScoreGroup), and how their outcomes read.
import { randomUUID } from "node:crypto";
import { Code } from "@connectrpc/connect";
import { ORSError, ScoreGroupFailedError, ToolCallError, ToolFailedError } from "./errors.js";
import type { CallToolResponse, ScoreGroupResponse } from "./gen/ors/v1/environment_service_pb.js";
import { ErrorReason } from "./gen/ors/v1/errors_pb.js";
import { candidateInit, refusalReason, toGroupScore, type GroupCandidate, type GroupScore, type Message } from "./messages.js";
import type { SessionRoute, TaskRun } from "./tasks.js";
import { jsonValue, toToolOutput, type JsonObject, type ToolOutput } from "./types.js";

/**
 * A call of the tool `name` with `input` (for attaching, the name only labels
 * errors), under an idempotency key of its own: however often it is sent, a
 * server that honours keys runs it once.
 */
export function toolCall(route: SessionRoute, name: string, input: JsonObject = {}): TaskRun<ToolOutput, CallToolResponse> {
  const { connection, sessionId, routeKey } = route;
  const key = randomUUID();
  return {
    key,
    start: (signal) =>
      connection.service.callTool({ sessionId, call: { name, input: jsonValue(input) }, idempotencyKey: key }, connection.routed(routeKey, signal)),
    attach: (taskId, signal) => connection.service.callTool({ sessionId, call: { name, taskId } }, connection.routed(routeKey, signal)),
    outcome: (last) => toolOutcome(name, last),
  };
}

/** A scoring of `candidates` (GroupCandidates, or bare transcripts). */
export function scoring(route: SessionRoute, candidates: (GroupCandidate | Message[])[]): TaskRun<GroupScore[], ScoreGroupResponse> {
  const { connection, sessionId, routeKey } = route;
  return {
    start: (signal) =>
      connection.service.scoreGroup({ sessionId, candidates: candidates.map(candidateInit) }, connection.routed(routeKey, signal)),
    attach: (taskId, signal) => connection.service.scoreGroup({ sessionId, taskId }, connection.routed(routeKey, signal)),
    outcome: scoringOutcome,
  };
}

/** The output of a call's last event (`result` or `failure`); throws for refusals and failures. */
export function toolOutcome(toolName: string, event: CallToolResponse["event"]): ToolOutput {
  if (event.case === "failure") throw new ToolFailedError(toolName, event.value.message);
  if (event.case !== "result") throw unexpected(event.case);
  const { outcome, reason } = event.value;
  if (outcome.case === "output") return toToolOutput(outcome.value);
  if (outcome.case === "error") throw new ToolCallError(toolName, outcome.value, refusalReason(reason));
  throw new ORSError(Code.Internal, ErrorReason.UNSPECIFIED, "a tool call result without an outcome");
}

/** The scores of a scoring's last event; throws ScoreGroupFailedError for a failure. */
export function scoringOutcome(event: ScoreGroupResponse["event"]): GroupScore[] {
  if (event.case === "failure") throw new ScoreGroupFailedError(event.value.message);
  if (event.case !== "result") throw unexpected(event.case);
  return event.value.scores.map(toGroupScore);
}

function unexpected(eventCase: string | undefined): ORSError {
  return new ORSError(Code.Internal, ErrorReason.UNSPECIFIED, `expected an outcome, got ${eventCase}`);
}
