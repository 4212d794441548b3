// A typed TypeScript client of the ORS gRPC service: the generated messages
// and service (src/gen/, from proto/ by protoc-gen-es) on Connect's gRPC
// transport, wrapped in an idiomatic API.
export { ORSClient, Environment } from "./client.js";
export type { PrepareOptions, Prepared } from "./client.js";
export type { ORSClientOptions, TlsOptions } from "./connection.js";
export { Episode, ORSEpisode } from "./episode.js";
export type { EpisodeRecord, ToolCallRecord } from "./episode_record.js";
export { EpisodeStream, StreamEpisode } from "./episode_stream.js";
export { DRAINING_PATIENCE_MS } from "./draining.js";
export { ORSError, ScoreGroupFailedError, ToolCallError, ToolError, ToolFailedError, ERROR_REASON_METADATA_KEY } from "./errors.js";
export { ErrorReason } from "./gen/ors/v1/errors_pb.js";
export { textMessage } from "./messages.js";
export type {
  GroupCandidate,
  GroupScore,
  Message,
  MessageBlock,
  MessageRole,
  ReasoningBlock,
  TerminalToolSpec,
  ToolCallBlock,
  ToolCallErrorReason,
  ToolListing,
  ToolResultBlock,
} from "./messages.js";
export type { EpisodeOptions } from "./requests.js";
export type { TaskOptions } from "./tasks.js";
export { textOf } from "./types.js";
export type { Block, ImageBlock, Json, JsonObject, Split, SplitType, TaskSource, TextBlock, ToolOutput, ToolSpec } from "./types.js";
export { Code } from "@connectrpc/connect";
