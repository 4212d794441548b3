// An episode of an ORS server: what every episode offers (ORSEpisode), and
// an episode driven with one RPC per step (Episode).
import { toEpisodeRecord, type EpisodeRecord } from "./episode_record.js";
import { rpc, ToolCallError } from "./errors.js";
import { toMessage, toToolListing, type GroupCandidate, type GroupScore, type Message, type TerminalToolSpec, type ToolListing } from "./messages.js";
import { attachTask, runTask, type SessionRoute, type TaskOptions } from "./tasks.js";
import { scoring, toolCall } from "./tool_calls.js";
import { toBlock, type Block, type JsonObject, type ToolOutput, type ToolSpec } from "./types.js";

/** What every episode offers, whether it runs on RPCs (Episode) or on a RunEpisode stream (StreamEpisode). */
export abstract class ORSEpisode implements AsyncDisposable {
  private listing: ToolListing | undefined;

  protected constructor(protected readonly route: SessionRoute) {}

  get sessionId(): string {
    return this.route.sessionId;
  }

  /** The episode's prompt. */
  abstract getPrompt(): Promise<Block[]>;

  /** The prompt as a role-tagged conversation (an environment without `get_messages` answers one user message). */
  abstract getMessages(): Promise<Message[]>;

  /**
   * Runs a tool. Resolves to its output; rejects with ToolCallError (refused:
   * unknown tool, bad input, episode finished; see its `reason`),
   * ToolFailedError (the tool raised) or ORSError (the RPC failed). A stream
   * that breaks while the tool runs is attached to again by task id, so the
   * tool runs once; one that breaks before the task id came is sent again
   * under the call's idempotency key once the server showed it honours keys
   * (else it rejects: the tool may or may not have run).
   */
  abstract callTool(name: string, input?: JsonObject, options?: TaskOptions): Promise<ToolOutput>;

  /**
   * Scores candidate completions of the episode's task (GroupCandidates, or
   * bare transcripts): one score per candidate, in order. Rejects with
   * ScoreGroupFailedError when the environment's scoring raised, ORSError
   * (reason SCORE_GROUP_UNSUPPORTED) when it has none. Reattached by task id
   * as tool calls are.
   */
  abstract scoreGroup(candidates: (GroupCandidate | Message[])[], options?: TaskOptions): Promise<GroupScore[]>;

  /** Ends the episode (teardown) and frees its session. Safe to call twice. */
  abstract close(): Promise<void>;

  protected abstract fetchToolListing(): Promise<ToolListing>;

  /** The episode's tools (shared, then the task's, then its toolset's; the terminal tool apart). */
  async listTools(): Promise<ToolSpec[]> {
    return (await this.toolListing()).tools;
  }

  /** The episode's tool listing, fetched anew (terminalTool and supportsScoreGroup reuse the last one). */
  async toolListing(): Promise<ToolListing> {
    return (this.listing = await this.fetchToolListing());
  }

  /** The tool that receives the agent's final plain message, or null. */
  async terminalTool(): Promise<TerminalToolSpec | null> {
    return (await this.knownListing()).terminalTool;
  }

  /** True when a plain assistant message ends the rollout: send its text to `callTerminalTool`. */
  async isAssistantMessageFinal(): Promise<boolean> {
    return (await this.terminalTool()) !== null;
  }

  /** Calls the terminal tool with `message` as its one input field; ToolCallError (`not_found`) when there is none. */
  async callTerminalTool(message = "", options: TaskOptions = {}): Promise<ToolOutput> {
    const spec = await this.terminalTool();
    if (spec === null) throw new ToolCallError("", "the episode has no terminal tool", "not_found");
    return this.callTool(spec.name, spec.arg === null ? {} : { [spec.arg]: message }, options);
  }

  /** True when the environment implements group scoring. */
  async supportsScoreGroup(): Promise<boolean> {
    return (await this.knownListing()).supportsScoreGroup;
  }

  /** Attaches to an earlier tool call of this episode by its task id: its outcome, waiting for it if need be. */
  attach(taskId: string, options: { signal?: AbortSignal } = {}): Promise<ToolOutput> {
    return attachTask(this.route, toolCall(this.route, ""), taskId, options.signal);
  }

  /** Attaches to an earlier scoring of this episode by its task id. */
  attachScoreGroup(taskId: string, options: { signal?: AbortSignal } = {}): Promise<GroupScore[]> {
    return attachTask(this.route, scoring(this.route, []), taskId, options.signal);
  }

  /**
   * What happened in this episode: its task, every tool call in order, totals.
   * Also after `close()`, while the server keeps the record (60 s by default).
   */
  async episodeRecord(): Promise<EpisodeRecord> {
    const { record } = await rpc(this.service.getEpisodeRecord({ sessionId: this.sessionId }, this.routed()));
    return toEpisodeRecord(record);
  }

  /** Marks the session as active, so the server does not reap it while idle. */
  async ping(): Promise<void> {
    await rpc(this.service.ping({ sessionId: this.sessionId }, this.routed()));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  protected get service() {
    return this.route.connection.service;
  }

  protected routed(signal?: AbortSignal) {
    return this.route.connection.routed(this.route.routeKey, signal);
  }

  private async knownListing(): Promise<ToolListing> {
    return this.listing ?? this.toolListing();
  }
}

/** An episode driven with one RPC per step (GetPrompt, CallTool, ..., DeleteEpisode and DeleteSessionId). */
export class Episode extends ORSEpisode {
  /** Use `Environment.createEpisode`. */
  constructor(route: SessionRoute) {
    super(route);
  }

  async getPrompt(): Promise<Block[]> {
    const { blocks } = await rpc(this.service.getPrompt({ sessionId: this.sessionId }, this.routed()));
    return blocks.map(toBlock);
  }

  async getMessages(): Promise<Message[]> {
    const { messages } = await rpc(this.service.getMessages({ sessionId: this.sessionId }, this.routed()));
    return messages.map(toMessage);
  }

  callTool(name: string, input: JsonObject = {}, options: TaskOptions = {}): Promise<ToolOutput> {
    return runTask(this.route, toolCall(this.route, name, input), options);
  }

  scoreGroup(candidates: (GroupCandidate | Message[])[], options: TaskOptions = {}): Promise<GroupScore[]> {
    return runTask(this.route, scoring(this.route, candidates), options);
  }

  async close(): Promise<void> {
    await rpc(this.service.deleteEpisode({ sessionId: this.sessionId }, this.routed()));
    await rpc(this.service.deleteSessionId({ sessionId: this.sessionId }, this.routed()));
  }

  protected async fetchToolListing(): Promise<ToolListing> {
    return toToolListing(await rpc(this.service.listTaskTools({ sessionId: this.sessionId }, this.routed())));
  }
}
