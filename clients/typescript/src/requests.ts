// Request messages built from the client's own types.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { CreateEpisodeRequestSchema } from "./gen/ors/v1/environment_service_pb.js";
import { jsonValue, type TaskSource } from "./types.js";

export interface EpisodeOptions {
  /** Secrets for the environment's constructor (name to value); never logged by the server. */
  secrets?: Record<string, string>;
  /** The session id to use (any non-empty string); by default a new UUID. */
  sessionId?: string;
  /** The name of a toolset registered with the server (`--toolset`) to attach: its tools join the episode's. */
  toolset?: string;
}

export function createEpisodeRequest(
  sessionId: string,
  envName: string,
  task: TaskSource,
  options: Pick<EpisodeOptions, "secrets" | "toolset"> = {},
): MessageInitShape<typeof CreateEpisodeRequestSchema> {
  const taskSource =
    "spec" in task
      ? { case: "taskSpec" as const, value: jsonValue(task.spec) }
      : { case: "taskIndex" as const, value: { split: task.split, index: BigInt(task.index) } };
  return { sessionId, envName, taskSource, secrets: options.secrets ?? {}, toolsetName: options.toolset };
}
