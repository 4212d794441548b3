// The client's own types: ORS data as plain TypeScript values (parsed JSON,
// string unions, numbers), converted from the generated messages in
// src/gen/ by the functions below.
import type { JsonValue as JsonValueMessage } from "./gen/ors/v1/types_pb.js";
import {
  SplitType as SplitTypeEnum,
  type Block as BlockMessage,
  type Split as SplitMessage,
  type ToolOutput as ToolOutputMessage,
  type ToolSpec as ToolSpecMessage,
} from "./gen/ors/v1/types_pb.js";

/** A JSON value as `JSON.parse` returns it. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A JSON object: a task spec, a tool input. */
export type JsonObject = { [key: string]: Json };

/** What a split is for. */
export type SplitType = "train" | "validation" | "test" | "unspecified";

/** One split of an environment. */
export interface Split {
  name: string;
  type: SplitType;
}

/** A tool an agent may call; `inputSchema` is its JSON schema (null when it takes no input). */
export interface ToolSpec {
  name: string;
  description: string;
  inputSchema: Json;
}

/** A text content block; `detail` is the environment's extra JSON (null when unset). */
export interface TextBlock {
  type: "text";
  text: string;
  detail: Json;
}

/** An image content block: raw bytes (no base64 on gRPC) and their MIME type. */
export interface ImageBlock {
  type: "image";
  data: Uint8Array;
  mimeType: string;
  detail: Json;
}

/** A prompt or tool output block. */
export type Block = TextBlock | ImageBlock;

/** What a tool returned. `reward` is null when the tool set none. */
export interface ToolOutput {
  blocks: Block[];
  metadata: Json;
  reward: number | null;
  finished: boolean;
}

/** The task an episode runs: one of a split by index, or a task spec given in full. */
export type TaskSource = { split: string; index: number } | { spec: JsonObject };

const SPLIT_TYPES: Record<SplitTypeEnum, SplitType> = {
  [SplitTypeEnum.UNSPECIFIED]: "unspecified",
  [SplitTypeEnum.TRAIN]: "train",
  [SplitTypeEnum.VALIDATION]: "validation",
  [SplitTypeEnum.TEST]: "test",
};

/** The text of the text blocks among `blocks`, joined by newlines. */
export function textOf(blocks: Block[]): string {
  return blocks.flatMap((block) => (block.type === "text" ? [block.text] : [])).join("\n");
}

/** Wraps a value as the JSON text a `JsonValue` message carries. */
export function jsonValue(value: Json): { json: string } {
  return { json: JSON.stringify(value) };
}

/**
 * Parses a `JsonValue` message (null when unset). Note: JSON.parse makes
 * integers beyond 2^53 imprecise; read `.json` with a big-number aware
 * parser if your task specs hold such values.
 */
export function parseJson(message: JsonValueMessage | undefined): Json {
  return message === undefined ? null : (JSON.parse(message.json) as Json);
}

/** A task spec: the JSON object of a `Task` message. */
export function taskSpec(message: { spec?: JsonValueMessage } | undefined): JsonObject {
  const spec = parseJson(message?.spec);
  if (spec === null || typeof spec !== "object" || Array.isArray(spec)) {
    throw new TypeError(`a task spec is a JSON object, got ${JSON.stringify(spec)}`);
  }
  return spec;
}

export function toSplit(split: SplitMessage): Split {
  return { name: split.name, type: SPLIT_TYPES[split.type] ?? "unspecified" };
}

export function toToolSpec(spec: ToolSpecMessage): ToolSpec {
  return { name: spec.name, description: spec.description, inputSchema: parseJson(spec.inputSchema) };
}

export function toBlock({ block }: Pick<BlockMessage, "block">): Block {
  switch (block.case) {
    case "text":
      return { type: "text", text: block.value.text, detail: parseJson(block.value.detail) };
    case "image": {
      const image = block.value;
      return { type: "image", data: image.data, mimeType: image.mimeType, detail: parseJson(image.detail) };
    }
    default:
      throw new TypeError("a Block message without content");
  }
}

export function toToolOutput(output: ToolOutputMessage): ToolOutput {
  return {
    blocks: output.blocks.map(toBlock),
    metadata: parseJson(output.metadata),
    reward: output.reward ?? null,
    finished: output.finished,
  };
}
