// Creations refused by a draining server (ERROR_REASON_DRAINING: it is about
// to restart, and started nothing) are made again under a new session id,
// which a load balancer hashing `x-session-id` sends to another backend; a
// few times, backing off, as the Python client does.
import { setTimeout as sleep } from "node:timers/promises";
import { ORSError } from "./errors.js";
import { ErrorReason } from "./gen/ors/v1/errors_pb.js";

const DRAINING_RETRIES = 8;
const DRAINING_BASE_DELAY_MS = 50;
const DRAINING_MAX_DELAY_MS = 1000;

export function isDraining(error: unknown): boolean {
  return error instanceof ORSError && error.reason === ErrorReason.DRAINING;
}

/** Runs `create(retry)` (retry 0, 1, ...; each under a new session id after the first) while the server is draining. */
export async function whileDraining<T>(create: (retry: number) => Promise<T>): Promise<T> {
  for (let retry = 0; ; retry += 1) {
    try {
      return await create(retry);
    } catch (error) {
      if (!isDraining(error) || retry >= DRAINING_RETRIES) throw error;
    }
    await sleep(Math.min(DRAINING_BASE_DELAY_MS * 2 ** retry, DRAINING_MAX_DELAY_MS));
  }
}
