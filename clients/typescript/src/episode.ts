// An episode driven with one RPC per step (CreateEpisode, GetPrompt,
// ListTaskTools, CallTool, ..., DeleteEpisode and DeleteSessionId).
import { rpc } from "./errors.js";
import { attachOnce, isBreak, readCall, reattach, type CallToolOptions, type SessionRoute } from "./tool_calls.js";
import { jsonValue, toBlock, toToolSpec, type Block, type JsonObject, type ToolOutput, type ToolSpec } from "./types.js";

/** What every episode offers, whether it runs on RPCs (Episode) or on a RunEpisode stream (StreamEpisode). */
export interface ORSEpisode extends AsyncDisposable {
  readonly sessionId: string;
  /** The episode's prompt. */
  getPrompt(): Promise<Block[]>;
  /** The episode's tools: the environment's shared tools, then the task's own. */
  listTools(): Promise<ToolSpec[]>;
  /**
   * Runs a tool. Resolves to its output; rejects with ToolCallError (refused:
   * unknown tool, bad input, episode finished), ToolFailedError (the tool
   * raised) or ORSError (the RPC failed). A stream that breaks while the tool
   * runs is attached to again by task id, so the tool runs once.
   */
  callTool(name: string, input?: JsonObject, options?: CallToolOptions): Promise<ToolOutput>;
  /** Attaches to an earlier call of this episode by its task id: its outcome, waiting for it if need be. */
  attach(taskId: string, options?: { signal?: AbortSignal }): Promise<ToolOutput>;
  /** Marks the session as active, so the server does not reap it while idle. */
  ping(): Promise<void>;
  /** Ends the episode (teardown) and frees its session. Safe to call twice. */
  close(): Promise<void>;
}

export class Episode implements ORSEpisode {
  /** Use `Environment.createEpisode`. */
  constructor(private readonly route: SessionRoute) {}

  get sessionId(): string {
    return this.route.sessionId;
  }

  async getPrompt(): Promise<Block[]> {
    const { blocks } = await rpc(this.service.getPrompt({ sessionId: this.sessionId }, this.routed()));
    return blocks.map(toBlock);
  }

  async listTools(): Promise<ToolSpec[]> {
    const { tools } = await rpc(this.service.listTaskTools({ sessionId: this.sessionId }, this.routed()));
    return tools.map(toToolSpec);
  }

  async callTool(name: string, input: JsonObject = {}, options: CallToolOptions = {}): Promise<ToolOutput> {
    let taskId: string | undefined;
    const events = this.service.callTool(
      { sessionId: this.sessionId, call: { name, input: jsonValue(input) } },
      this.routed(options.signal),
    );
    try {
      return await readCall(events, name, (id) => {
        taskId = id;
        options.onTaskId?.(id);
      });
    } catch (error) {
      // Before the task id arrived the tool may or may not have started: not retried.
      if (taskId === undefined || !isBreak(error, options.signal)) throw error;
      return reattach(this.route, name, taskId, error, options.signal);
    }
  }

  async attach(taskId: string, options: { signal?: AbortSignal } = {}): Promise<ToolOutput> {
    try {
      return await attachOnce(this.route, "", taskId, options.signal);
    } catch (error) {
      if (!isBreak(error, options.signal)) throw error;
      return reattach(this.route, "", taskId, error, options.signal);
    }
  }

  async ping(): Promise<void> {
    await rpc(this.service.ping({ sessionId: this.sessionId }, this.routed()));
  }

  async close(): Promise<void> {
    await rpc(this.service.deleteEpisode({ sessionId: this.sessionId }, this.routed()));
    await rpc(this.service.deleteSessionId({ sessionId: this.sessionId }, this.routed()));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  private get service() {
    return this.route.connection.service;
  }

  private routed(signal?: AbortSignal) {
    return this.route.connection.routed(this.route.routeKey, signal);
  }
}
