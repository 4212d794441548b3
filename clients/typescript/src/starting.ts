// Calls made while the episode's setup still runs: the server answers them,
// after waiting a while (`--setup-wait`), with ENVIRONMENT_STARTING and a
// `retry-after`; nothing ran, so they are asked again, as the Python client
// does, for up to a limit (10 minutes by default).
import { setTimeout as sleep } from "node:timers/promises";
import { ORSError } from "./errors.js";
import { ErrorReason } from "./gen/ors/v1/errors_pb.js";

/** When the server gives no retry-after. */
const DEFAULT_RETRY_AFTER_S = 2;

export function isStarting(error: unknown): error is ORSError & { reason: ErrorReason.ENVIRONMENT_STARTING } {
  return error instanceof ORSError && error.reason === ErrorReason.ENVIRONMENT_STARTING;
}

/** Waits the server's retry-after of a "still starting" answer; rejects with an ORSError when `signal` aborts. */
export async function pauseWhileStarting(error: ORSError, signal?: AbortSignal): Promise<void> {
  await sleep((error.retryAfterSeconds ?? DEFAULT_RETRY_AFTER_S) * 1000, undefined, { signal }).catch((abort: unknown) => {
    throw ORSError.from(abort);
  });
}

/** Runs `attempt` again while it fails with ENVIRONMENT_STARTING, for up to `limitMs`. */
export async function whileStarting<T>(attempt: () => Promise<T>, limitMs: number, signal?: AbortSignal): Promise<T> {
  const deadline = Date.now() + limitMs;
  for (;;) {
    try {
      return await attempt();
    } catch (error) {
      if (!isStarting(error) || Date.now() >= deadline) throw error;
      await pauseWhileStarting(error, signal);
    }
  }
}
