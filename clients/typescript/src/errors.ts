// The client's errors: one for failed RPCs (and failed RunEpisode steps),
// two for tool calls that produced no output.
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorReason, ErrorReasonSchema } from "./gen/ors/v1/errors_pb.js";
import type { StepError } from "./gen/ors/v1/environment_service_pb.js";
import type { ToolCallErrorReason } from "./messages.js";

/** The trailing metadata entry in which the server names an RPC's ErrorReason. */
export const ERROR_REASON_METADATA_KEY = "ors-error-reason";

/**
 * An RPC (or a RunEpisode step) failed. `code` is the gRPC status code,
 * `reason` the ORS ErrorReason the server sent (`ErrorReason.UNSPECIFIED`
 * when it sent none, as for transport errors), `reasonName` its proto name
 * (`ERROR_REASON_SESSION_NOT_FOUND`), `detail` the server's message.
 */
export class ORSError extends Error {
  override name = "ORSError";
  readonly reasonName: string;
  /** The server's `retry-after` (seconds), sent when it is full or the environment still starting; else null. */
  readonly retryAfterSeconds: number | null;

  constructor(
    readonly code: Code,
    readonly reason: ErrorReason,
    readonly detail: string,
    options?: { cause?: unknown; retryAfterSeconds?: number | null },
  ) {
    const reasonName = ErrorReasonSchema.value[reason]?.name ?? `ERROR_REASON_${reason}`;
    super(`${reasonName} (${Code[code] ?? code}): ${detail}`, options);
    this.reasonName = reasonName;
    this.retryAfterSeconds = options?.retryAfterSeconds ?? null;
  }

  /** From whatever a Connect call threw: its status, and the reason (and retry-after) from its trailers. */
  static from(error: unknown): ORSError {
    if (error instanceof ORSError) return error;
    const connectError = ConnectError.from(error);
    const name = connectError.metadata.get(ERROR_REASON_METADATA_KEY);
    const reason = ErrorReasonSchema.values.find((value) => value.name === name)?.number ?? ErrorReason.UNSPECIFIED;
    const retryAfter = Number.parseFloat(connectError.metadata.get("retry-after") ?? "");
    const retryAfterSeconds = Number.isFinite(retryAfter) ? retryAfter : null;
    return new ORSError(connectError.code, reason, connectError.rawMessage, { cause: error, retryAfterSeconds });
  }

  /** From a RunEpisode `StepError`: what the step's own RPC would have thrown. */
  static fromStepError(error: StepError): ORSError {
    const code = error.code in Code ? (error.code as Code) : Code.Unknown;
    return new ORSError(code, error.reason, error.message);
  }
}

/** A tool call produced no output; see the two subclasses. */
export class ToolError extends Error {
  override name = "ToolError";

  constructor(
    readonly toolName: string,
    readonly detail: string,
  ) {
    super(`${toolName ? `tool ${JSON.stringify(toolName)}` : "tool call"}: ${detail}`);
  }
}

/**
 * The server refused the call without running the tool (a tool-level error:
 * unknown tool, input not matching its schema, episode finished); `reason`
 * says which, when the server said (openreward's names: `not_found`, ...).
 */
export class ToolCallError extends ToolError {
  override name = "ToolCallError";

  constructor(
    toolName: string,
    detail: string,
    readonly reason: ToolCallErrorReason | null = null,
  ) {
    super(toolName, detail);
  }
}

/**
 * The tool ran and raised; `detail` is its exception's message. The episode lives on.
 * (A call whose environment's process died under it is an ORSError, ENVIRONMENT_CRASHED: the episode is lost.)
 */
export class ToolFailedError extends ToolError {
  override name = "ToolFailedError";
}

/** The environment's `score_group` raised, or returned a wrong number of scores. The episode lives on. */
export class ScoreGroupFailedError extends Error {
  override name = "ScoreGroupFailedError";

  constructor(readonly detail: string) {
    super(`score_group: ${detail}`);
  }
}

/** Runs a Connect call, turning what it throws into an ORSError. */
export async function rpc<T>(call: Promise<T>): Promise<T> {
  try {
    return await call;
  } catch (error) {
    throw ORSError.from(error);
  }
}
