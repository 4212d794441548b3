// Work with a task id (a tool call, a group scoring): a server stream that
// sends the task id first, then the outcome. The work runs on regardless of
// the stream, so a stream that broke once the task id was known is attached
// to again by that id instead of starting the work twice; a tool call that
// broke before is sent again under its idempotency key, when the server
// honours keys.
import { setTimeout as sleep } from "node:timers/promises";
import { Code } from "@connectrpc/connect";
import type { Connection } from "./connection.js";
import { ORSError } from "./errors.js";
import { ErrorReason } from "./gen/ors/v1/errors_pb.js";
import { whileStarting } from "./starting.js";

/** Statuses of a stream that broke in transit (no ORS reason): worth attaching again. */
const BREAK_CODES = new Set([Code.Unavailable, Code.Internal, Code.Unknown, Code.Canceled, Code.Aborted]);
const FIRST_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 2000;

export interface TaskOptions {
  /** Cancels waiting for the outcome (the work itself runs on: attach to it by task id). */
  signal?: AbortSignal;
  /** Called with the task id as soon as it is known. */
  onTaskId?: (taskId: string) => void;
}

/** The events of a CallTool or ScoreGroup stream. */
export interface TaskEvent {
  event: { case: "taskId"; value: string } | { case: "result" | "failure"; value: unknown } | { case: undefined; value?: undefined };
}

/** How to run one kind of work: start it, attach to it, read its outcome. */
export interface TaskRun<T, E extends TaskEvent> {
  start(signal?: AbortSignal): AsyncIterable<E>;
  attach(taskId: string, signal?: AbortSignal): AsyncIterable<E>;
  /** The outcome of the last event; throws for failures and refusals. */
  outcome(last: E["event"]): T;
  /**
   * The idempotency key `start` sends, if any: a server that honours keys
   * runs the work under it as its task id, once however often it is sent.
   */
  key?: string;
}

/** The pause before try `attempt` + 1 of something that broke: 0.1 s, doubling, at most 2 s. */
export function backoffMs(attempt: number): number {
  return Math.min(FIRST_BACKOFF_MS * 2 ** attempt, MAX_BACKOFF_MS);
}

/** Where a session's calls go: its id, and the `x-session-id` that routes them. */
export interface SessionRoute {
  connection: Connection;
  sessionId: string;
  routeKey: string;
}

/** Whether a failed call broke in transit, rather than being refused or cancelled by us. */
export function isBreak(error: unknown, signal?: AbortSignal): error is ORSError {
  return error instanceof ORSError && error.reason === ErrorReason.UNSPECIFIED && BREAK_CODES.has(error.code) && !signal?.aborted;
}

/** Reads a task stream to its outcome, telling the task id on the way. */
export async function readTask<T, E extends TaskEvent>(
  events: AsyncIterable<E>,
  run: TaskRun<T, E>,
  onTaskId: (taskId: string) => void,
): Promise<T> {
  let last: E["event"] | undefined;
  try {
    for await (const { event } of events) {
      if (event.case === "taskId") {
        onTaskId(event.value);
        continue;
      }
      last = event;
      break;
    }
  } catch (error) {
    throw ORSError.from(error);
  }
  if (last === undefined) throw new ORSError(Code.Unavailable, ErrorReason.UNSPECIFIED, "the stream ended without an outcome");
  return run.outcome(last);
}

/**
 * Starts the work and reads its outcome; a stream broken after the task id
 * came is attached to again, and work refused as "still starting" (before
 * any task id: nothing ran) is started again after the server's retry-after.
 */
export function runTask<T, E extends TaskEvent>(route: SessionRoute, run: TaskRun<T, E>, options: TaskOptions = {}): Promise<T> {
  return whileStarting(() => runTaskOnce(route, run, options), route.connection.startingRetryMs, options.signal);
}

async function runTaskOnce<T, E extends TaskEvent>(route: SessionRoute, run: TaskRun<T, E>, options: TaskOptions): Promise<T> {
  let taskId: string | undefined;
  const onTaskId = (id: string) => {
    if (id === run.key) route.connection.honoursIdempotencyKeys = true;
    if (taskId === undefined) options.onTaskId?.(id);
    taskId = id;
  };
  try {
    return await readTask(run.start(options.signal), run, onTaskId);
  } catch (error) {
    if (!isBreak(error, options.signal)) throw error;
    if (taskId !== undefined) return reattach(route, run, taskId, error, options.signal);
    // Before the task id came the work may or may not have started: it is
    // sent again only under its idempotency key, to a server that showed it
    // honours keys (it then runs once); otherwise the break is the answer.
    if (run.key === undefined || !route.connection.honoursIdempotencyKeys) throw error;
    return tryAgain(route, run, () => run.start(options.signal), error, options.signal, onTaskId);
  }
}

/** Attaches to the work `taskId` (its outcome, waiting for it if need be), again if the stream breaks. */
export async function attachTask<T, E extends TaskEvent>(route: SessionRoute, run: TaskRun<T, E>, taskId: string, signal?: AbortSignal): Promise<T> {
  try {
    return await readTask(run.attach(taskId, signal), run, () => {});
  } catch (error) {
    if (!isBreak(error, signal)) throw error;
    return reattach(route, run, taskId, error, signal);
  }
}

/**
 * Attaches to the work `taskId` after its stream broke, again after each
 * break, up to the connection's `reattachAttempts` times, backing off from
 * 0.1 s to 2 s between tries; rethrows the last break when attempts run out.
 */
export function reattach<T, E extends TaskEvent>(
  route: SessionRoute,
  run: TaskRun<T, E>,
  taskId: string,
  broke: ORSError,
  signal?: AbortSignal,
): Promise<T> {
  return tryAgain(route, run, () => run.attach(taskId, signal), broke, signal);
}

/** Opens `events` again after each break, as `reattach` says; `onTaskId` hears the task id of each. */
async function tryAgain<T, E extends TaskEvent>(
  route: SessionRoute,
  run: TaskRun<T, E>,
  events: () => AsyncIterable<E>,
  broke: ORSError,
  signal?: AbortSignal,
  onTaskId: (taskId: string) => void = () => {},
): Promise<T> {
  let lastBreak = broke;
  for (let attempt = 0; attempt < route.connection.reattachAttempts; attempt += 1) {
    await sleep(backoffMs(attempt), undefined, { signal }).catch((error: unknown) => {
      throw ORSError.from(error);
    });
    try {
      return await readTask(events(), run, onTaskId);
    } catch (error) {
      if (!isBreak(error, signal)) throw error;
      lastBreak = error;
    }
  }
  throw lastBreak;
}
