// Creations refused by a draining server (ERROR_REASON_DRAINING: it is about
// to restart, and started nothing) are made again under a new session id,
// which a load balancer hashing `x-session-id` sends to another backend;
// backing off, for up to DRAINING_PATIENCE_MS, as the Python client does.
// Every new id is a new draw of the backends, so a count of tries would lose
// one creation in 2 ** tries while one of two backends drains; some 30 draws
// in 30 s make that negligible, and a lone server being replaced is waited for.
import { setTimeout as sleep } from "node:timers/promises";
import { ORSError } from "./errors.js";
import { ErrorReason } from "./gen/ors/v1/errors_pb.js";

/** How long a creation keeps being made again while it reaches draining servers. */
export const DRAINING_PATIENCE_MS = 30_000;
const DRAINING_BASE_DELAY_MS = 50;
const DRAINING_MAX_DELAY_MS = 1000;

export function isDraining(error: unknown): boolean {
  return error instanceof ORSError && error.reason === ErrorReason.DRAINING;
}

/** Runs `create(retry)` (retry 0, 1, ...; each under a new session id after the first) while the server is draining. */
export async function whileDraining<T>(create: (retry: number) => Promise<T>): Promise<T> {
  const deadline = Date.now() + DRAINING_PATIENCE_MS;
  for (let retry = 0; ; retry += 1) {
    const delay = Math.min(DRAINING_BASE_DELAY_MS * 2 ** retry, DRAINING_MAX_DELAY_MS);
    try {
      return await create(retry);
    } catch (error) {
      if (!isDraining(error) || Date.now() + delay > deadline) throw error;
    }
    await sleep(delay);
  }
}
