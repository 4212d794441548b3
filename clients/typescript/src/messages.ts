// The openreward surface's values as plain TypeScript: role-tagged messages
// (GetMessages, ScoreGroup candidates), group scores, the terminal tool and
// tool listings, converted to and from the generated messages.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ListTaskToolsResponse, ListToolsResponse } from "./gen/ors/v1/environment_service_pb.js";
import {
  MessageRole as MessageRoleEnum,
  RunToolErrorReason,
  type GroupCandidateSchema,
  type GroupScore as GroupScoreMessage,
  type Message as MessageMessage,
  type MessageBlock as MessageBlockMessage,
  type MessageBlockSchema,
  type MessageSchema,
  type TerminalToolSpec as TerminalToolSpecMessage,
} from "./gen/ors/v1/types_pb.js";
import { parseJson, toBlock, toToolSpec, type Block, type Json, type ToolSpec } from "./types.js";

/** Who speaks a message. */
export type MessageRole = "system" | "user" | "assistant";

/** A reasoning (thinking) segment of an assistant turn; `signature` is null when there is none. */
export interface ReasoningBlock {
  type: "reasoning";
  text: string;
  signature: string | null;
  detail: Json;
}

/** A tool invocation inside an assistant turn. */
export interface ToolCallBlock {
  type: "tool_call";
  id: string;
  name: string;
  input: Json;
  detail: Json;
}

/** A tool's result inside a user turn, answering the ToolCallBlock `toolCallId`. */
export interface ToolResultBlock {
  type: "tool_result";
  toolCallId: string;
  blocks: Block[];
  isError: boolean;
  detail: Json;
}

/** Any block a message may carry. */
export type MessageBlock = Block | ReasoningBlock | ToolCallBlock | ToolResultBlock;

/** One turn of a conversation. */
export interface Message {
  role: MessageRole;
  blocks: MessageBlock[];
  detail: Json;
}

/** One rollout's completion to score: its transcript, and the caller's data echoed to the environment. */
export interface GroupCandidate {
  messages: Message[];
  metadata?: Json;
}

/** The score of one candidate, in the candidates' order. */
export interface GroupScore {
  reward: number;
  metadata: Json;
}

/** The tool that receives the agent's final plain message, in its one input field `arg` (null: no input). */
export interface TerminalToolSpec {
  name: string;
  arg: string | null;
  description: string;
}

/** A tool listing: the tools (the terminal tool apart), the terminal tool, and what messages may hold. */
export interface ToolListing {
  tools: ToolSpec[];
  terminalTool: TerminalToolSpec | null;
  supportsScoreGroup: boolean;
  messageBlockTypes: string[];
}

/** Why the server refused a tool call (as openreward's JSON names it); null when it gave no reason. */
export type ToolCallErrorReason = "not_found" | "name_collision" | "input_validation" | "episode_finished";

const ROLES: Record<MessageRole, MessageRoleEnum> = {
  system: MessageRoleEnum.SYSTEM,
  user: MessageRoleEnum.USER,
  assistant: MessageRoleEnum.ASSISTANT,
};

const REFUSAL_REASONS: Record<RunToolErrorReason, ToolCallErrorReason | null> = {
  [RunToolErrorReason.UNSPECIFIED]: null,
  [RunToolErrorReason.NOT_FOUND]: "not_found",
  [RunToolErrorReason.NAME_COLLISION]: "name_collision",
  [RunToolErrorReason.INPUT_VALIDATION]: "input_validation",
  [RunToolErrorReason.EPISODE_FINISHED]: "episode_finished",
};

/** A message of text alone, e.g. the assistant's final answer to append to a transcript. */
export function textMessage(role: MessageRole, text: string): Message {
  return { role, blocks: [{ type: "text", text, detail: null }], detail: null };
}

export function refusalReason(reason: RunToolErrorReason): ToolCallErrorReason | null {
  return REFUSAL_REASONS[reason] ?? null;
}

export function toToolListing(listing: ListToolsResponse | ListTaskToolsResponse): ToolListing {
  const terminal = listing.terminalTool;
  return {
    tools: listing.tools.map(toToolSpec),
    terminalTool: terminal === undefined ? null : toTerminalToolSpec(terminal),
    supportsScoreGroup: listing.supportsScoreGroup,
    messageBlockTypes: [...listing.messageBlockTypes],
  };
}

function toTerminalToolSpec(spec: TerminalToolSpecMessage): TerminalToolSpec {
  return { name: spec.name, arg: spec.arg ?? null, description: spec.description };
}

export function toMessage(message: MessageMessage): Message {
  const role = (Object.keys(ROLES) as MessageRole[]).find((name) => ROLES[name] === message.role);
  if (role === undefined) throw new TypeError(`a message without a role (${message.role})`);
  return { role, blocks: message.blocks.map(toMessageBlock), detail: parseJson(message.detail) };
}

function toMessageBlock({ block }: MessageBlockMessage): MessageBlock {
  switch (block.case) {
    case "text":
    case "image":
      return toBlock({ block });
    case "reasoning":
      return { type: "reasoning", text: block.value.text, signature: block.value.signature ?? null, detail: parseJson(block.value.detail) };
    case "toolCall": {
      const { id, name, input, detail } = block.value;
      return { type: "tool_call", id, name, input: parseJson(input), detail: parseJson(detail) };
    }
    case "toolResult": {
      const { toolCallId, blocks, isError, detail } = block.value;
      return { type: "tool_result", toolCallId, blocks: blocks.map(toBlock), isError, detail: parseJson(detail) };
    }
    default:
      throw new TypeError("a MessageBlock message without content");
  }
}

export function toGroupScore(score: GroupScoreMessage): GroupScore {
  return { reward: score.reward, metadata: parseJson(score.metadata) };
}

/** A JsonValue message of `value`, unset for null (the proto's "unset means null"). */
function optionalJson(value: Json | undefined): { json: string } | undefined {
  return value === null || value === undefined ? undefined : { json: JSON.stringify(value) };
}

/** The content oneof of a text or image block, as the Block and MessageBlock messages both hold it. */
function blockContent(block: Block) {
  return block.type === "text"
    ? { case: "text" as const, value: { text: block.text, detail: optionalJson(block.detail) } }
    : { case: "image" as const, value: { data: block.data, mimeType: block.mimeType, detail: optionalJson(block.detail) } };
}

function messageBlockInit(block: MessageBlock): MessageInitShape<typeof MessageBlockSchema> {
  const detail = optionalJson(block.detail);
  switch (block.type) {
    case "text":
    case "image":
      return { block: blockContent(block) };
    case "reasoning":
      return { block: { case: "reasoning", value: { text: block.text, signature: block.signature ?? undefined, detail } } };
    case "tool_call":
      return { block: { case: "toolCall", value: { id: block.id, name: block.name, input: optionalJson(block.input), detail } } };
    case "tool_result": {
      const blocks = block.blocks.map((inner) => ({ block: blockContent(inner) }));
      return { block: { case: "toolResult", value: { toolCallId: block.toolCallId, blocks, isError: block.isError, detail } } };
    }
  }
}

export function messageInit(message: Message): MessageInitShape<typeof MessageSchema> {
  return { role: ROLES[message.role], blocks: message.blocks.map(messageBlockInit), detail: optionalJson(message.detail) };
}

/** A candidate as a GroupCandidate message; a bare transcript is a candidate without metadata. */
export function candidateInit(candidate: GroupCandidate | Message[]): MessageInitShape<typeof GroupCandidateSchema> {
  const { messages, metadata } = Array.isArray(candidate) ? { messages: candidate, metadata: undefined } : candidate;
  return { messages: messages.map(messageInit), metadata: optionalJson(metadata) };
}
