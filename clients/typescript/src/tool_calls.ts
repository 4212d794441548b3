// Reading a tool call's outcome, and attaching to a call again by its task
// id when the stream that carried it broke (the tool runs on regardless).
import { setTimeout as sleep } from "node:timers/promises";
import { Code } from "@connectrpc/connect";
import type { Connection } from "./connection.js";
import { ORSError, ToolCallError, ToolFailedError } from "./errors.js";
import type { CallToolResponse } from "./gen/ors/v1/environment_service_pb.js";
import { ErrorReason } from "./gen/ors/v1/errors_pb.js";
import { toToolOutput, type ToolOutput } from "./types.js";

/** Statuses of a stream that broke in transit (no ORS reason): worth attaching again. */
const BREAK_CODES = new Set([Code.Unavailable, Code.Internal, Code.Unknown, Code.Canceled, Code.Aborted]);
const FIRST_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 2000;

export interface CallToolOptions {
  /** Cancels waiting for the outcome (the tool itself runs on: attach to it by task id). */
  signal?: AbortSignal;
  /** Called with the call's task id as soon as it is known. */
  onTaskId?: (taskId: string) => void;
}

/** Whether a failed call broke in transit, rather than being refused or cancelled by us. */
export function isBreak(error: unknown, signal?: AbortSignal): error is ORSError {
  return error instanceof ORSError && error.reason === ErrorReason.UNSPECIFIED && BREAK_CODES.has(error.code) && !signal?.aborted;
}

/** The output of a call's last event (`result` or `failure`); throws for refusals and failures. */
export function outcomeOf(toolName: string, event: CallToolResponse["event"]): ToolOutput {
  if (event.case === "failure") throw new ToolFailedError(toolName, event.value.message);
  if (event.case !== "result") throw new ORSError(Code.Internal, ErrorReason.UNSPECIFIED, `expected a tool call's outcome, got ${event.case}`);
  const { outcome } = event.value;
  if (outcome.case === "output") return toToolOutput(outcome.value);
  if (outcome.case === "error") throw new ToolCallError(toolName, outcome.value);
  throw new ORSError(Code.Internal, ErrorReason.UNSPECIFIED, "a tool call result without an outcome");
}

/** Reads a CallTool stream: the task id event, then the outcome. */
export async function readCall(
  events: AsyncIterable<CallToolResponse>,
  toolName: string,
  onTaskId: (taskId: string) => void,
): Promise<ToolOutput> {
  try {
    for await (const { event } of events) {
      if (event.case === "taskId") onTaskId(event.value);
      else return outcomeOf(toolName, event);
    }
  } catch (error) {
    if (error instanceof ToolCallError || error instanceof ToolFailedError) throw error;
    throw ORSError.from(error);
  }
  throw new ORSError(Code.Unavailable, ErrorReason.UNSPECIFIED, "the CallTool stream ended without an outcome");
}

/** Where a session's calls go: its id, and the `x-session-id` that routes them. */
export interface SessionRoute {
  connection: Connection;
  sessionId: string;
  routeKey: string;
}

/** Attaches to the call `taskId` with CallTool, once. */
export function attachOnce(route: SessionRoute, toolName: string, taskId: string, signal?: AbortSignal): Promise<ToolOutput> {
  const events = route.connection.service.callTool(
    { sessionId: route.sessionId, call: { name: toolName, taskId } },
    route.connection.routed(route.routeKey, signal),
  );
  return readCall(events, toolName, () => {});
}

/**
 * Attaches to the call `taskId` after its stream broke, again after each
 * break, up to the connection's `reattachAttempts` times, backing off from
 * 0.1 s to 2 s between tries; rethrows `broke` when attempts run out.
 */
export async function reattach(
  route: SessionRoute,
  toolName: string,
  taskId: string,
  broke: ORSError,
  signal?: AbortSignal,
): Promise<ToolOutput> {
  let lastBreak = broke;
  for (let attempt = 0; attempt < route.connection.reattachAttempts; attempt += 1) {
    await sleep(Math.min(FIRST_BACKOFF_MS * 2 ** attempt, MAX_BACKOFF_MS), undefined, { signal }).catch((error: unknown) => {
      throw ORSError.from(error);
    });
    try {
      return await attachOnce(route, toolName, taskId, signal);
    } catch (error) {
      if (!isBreak(error, signal)) throw error;
      lastBreak = error;
    }
  }
  throw lastBreak;
}
