// The entry point: ORSClient (server-wide calls, episode streams) and
// Environment (discovery of one environment, episodes of it).
import { randomUUID } from "node:crypto";
import { Connection, type ORSClientOptions } from "./connection.js";
import { Episode } from "./episode.js";
import { toEpisodeRecord, type EpisodeRecord } from "./episode_record.js";
import { EpisodeStream } from "./episode_stream.js";
import { whileDraining } from "./draining.js";
import { rpc } from "./errors.js";
import { createEpisodeRequest, type EpisodeOptions } from "./requests.js";
import { toToolListing, type ToolListing } from "./messages.js";
import { jsonValue, taskSpec, toSplit, type JsonObject, type Split, type TaskSource, type ToolSpec } from "./types.js";

/** A client of an ORS gRPC server (`ors.v1.EnvironmentService`). */
export class ORSClient implements Disposable {
  private readonly connection: Connection;

  /** `target` is `host:port`, e.g. `127.0.0.1:50051`. */
  constructor(target: string, options: ORSClientOptions = {}) {
    this.connection = new Connection(target, options);
  }

  /** The generated, fully typed service client, for anything this class does not wrap. */
  get service() {
    return this.connection.service;
  }

  async health(): Promise<{ status: string; openSessions: number }> {
    const { status, openSessions } = await rpc(this.service.health({}));
    return { status, openSessions: Number(openSessions) };
  }

  async version(): Promise<string> {
    return (await rpc(this.service.version({}))).version;
  }

  /** What happened in the episode of `sessionId` (made by any client, on any door): live, or ended within the linger. */
  async episodeRecord(sessionId: string): Promise<EpisodeRecord> {
    const routed = this.connection.routed(sessionId);
    return toEpisodeRecord((await rpc(this.service.getEpisodeRecord({ sessionId }, routed))).record);
  }

  /** The hosted environments' names; the first is the default one. */
  async listEnvironments(): Promise<string[]> {
    return (await rpc(this.service.listEnvironments({}))).names;
  }

  /** One hosted environment, by (case-insensitive) name. */
  environment(name: string): Environment {
    return new Environment(name, this.connection);
  }

  /**
   * Opens a RunEpisode stream: episodes on it cost a few times less than an
   * RPC per step. Close it when done (`await stream.close()`).
   */
  openEpisodeStream(routeKey?: string): EpisodeStream {
    return new EpisodeStream(this.connection, routeKey);
  }

  /** Closes the connection, ending the calls still open on it. */
  close(): void {
    this.connection.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

export interface PrepareOptions {
  /** Secrets for the environments' constructors: a creation must carry exactly these to claim an episode. */
  secrets?: Record<string, string>;
  /**
   * One session id per task (e.g. `randomUUID()` each): each episode is
   * reserved for the creation under that id (`createEpisode(task, { sessionId })`,
   * or on a stream opened with that id as its route key), and prepared by a
   * request of its own routed by it (`x-session-id`), so that behind a load
   * balancer hashing it the prepare and the creation reach one backend.
   */
  sessionIds?: string[];
}

/** What `Environment.prepare` started. */
export interface Prepared {
  /** How many episodes are being prepared (one per task given). */
  preparing: number;
  /** Seconds a prepared episode is kept, once its setup ended, before it is torn down unclaimed. */
  ttlSeconds: number;
}

/** The tasks of a PrepareEpisodes or CancelPreparedEpisodes request: task specs, or indices of a split. */
function taskSelection(tasks: JsonObject[] | { split: string; indices: number[] }) {
  return Array.isArray(tasks)
    ? { taskSpecs: tasks.map(jsonValue) }
    : { split: tasks.split, indices: tasks.indices.map((index) => BigInt(index)) };
}

/** Discovery and episodes of one environment. */
export class Environment {
  /** Use `ORSClient.environment`. */
  constructor(
    readonly name: string,
    private readonly connection: Connection,
  ) {}

  async listSplits(): Promise<Split[]> {
    return (await rpc(this.service.listSplits({ envName: this.name }))).splits.map(toSplit);
  }

  /** The specs of all tasks of a split. */
  async listTasks(split: string): Promise<JsonObject[]> {
    return (await rpc(this.service.listTasks({ envName: this.name, split }))).tasks.map(taskSpec);
  }

  async numTasks(split: string): Promise<number> {
    return Number((await rpc(this.service.numTasks({ envName: this.name, split }))).numTasks);
  }

  async getTask(split: string, index: number): Promise<JsonObject> {
    return taskSpec((await rpc(this.service.getTask({ envName: this.name, split, index: BigInt(index) }))).task);
  }

  /** The specs of tasks [start, stop) of a split, with Python slice semantics (negative counts from the end). */
  async getTaskRange(split: string, start?: number, stop?: number): Promise<JsonObject[]> {
    const request = {
      envName: this.name,
      split,
      ...(start === undefined ? {} : { start: BigInt(start) }),
      ...(stop === undefined ? {} : { stop: BigInt(stop) }),
    };
    return (await rpc(this.service.getTaskRange(request))).tasks.map(taskSpec);
  }

  /** The environment's shared tools (those of every task; the terminal tool apart). */
  async listTools(): Promise<ToolSpec[]> {
    return (await this.toolListing()).tools;
  }

  /** The shared tools, the terminal tool, group-scoring support and the block types messages may hold. */
  async toolListing(): Promise<ToolListing> {
    return toToolListing(await rpc(this.service.listTools({ envName: this.name })));
  }

  /**
   * Has the server set up episodes ahead (warm episodes, an ORS extension;
   * PrepareEpisodes): one per entry of `tasks` (task specs, or indices of a
   * split; repeat a task for several episodes of it). A later episode of the
   * same task (the same canonical JSON) with exactly the same `secrets` (and
   * API key), by `createEpisode` or on a stream, claims one and need not wait
   * for its setup. Resolves to how many are being prepared and for how long
   * the server keeps one unclaimed once its setup ended.
   */
  async prepare(tasks: JsonObject[] | { split: string; indices: number[] }, options: PrepareOptions = {}): Promise<Prepared> {
    const base = { envName: this.name, secrets: options.secrets ?? {} };
    const { sessionIds } = options;
    if (sessionIds === undefined) {
      const { preparing, ttlSeconds } = await rpc(this.service.prepareEpisodes({ ...base, ...taskSelection(tasks) }));
      return { preparing: Number(preparing), ttlSeconds };
    }
    // One request per reserved id, routed by it.
    const entries = Array.isArray(tasks)
      ? tasks.map((spec) => ({ taskSpecs: [jsonValue(spec)] }))
      : tasks.indices.map((index) => ({ split: tasks.split, indices: [BigInt(index)] }));
    if (sessionIds.length !== entries.length) throw new RangeError("pass one session id per task");
    const answers = await Promise.all(
      entries.map((entry, position) => {
        const sessionId = sessionIds[position]!;
        const request = { ...base, ...entry, sessionIds: [sessionId] };
        return rpc(this.service.prepareEpisodes(request, this.connection.routed(sessionId)));
      }),
    );
    const preparing = answers.reduce((sum, answer) => sum + Number(answer.preparing), 0);
    return { preparing, ttlSeconds: answers[0]?.ttlSeconds ?? 0 };
  }

  /**
   * Cancels episodes `prepare` set up that are not claimed yet
   * (CancelPreparedEpisodes): their setup is cancelled, `teardown()` runs and
   * each frees its place in the server's session limit. Only episodes
   * prepared with exactly these `secrets` (and API key) are cancelled: one of
   * each entry of `tasks`, or every one of this environment when `tasks` is
   * omitted. Resolves to how many were cancelled.
   */
  async cancelPrepared(
    tasks?: JsonObject[] | { split: string; indices: number[] },
    options: PrepareOptions = {},
  ): Promise<number> {
    const which = tasks === undefined ? {} : taskSelection(tasks);
    const request = { envName: this.name, ...which, secrets: options.secrets ?? {} };
    const { cancelled } = await rpc(this.service.cancelPreparedEpisodes(request));
    return Number(cancelled);
  }

  /**
   * Starts an episode with one RPC per step (CreateEpisode, then GetPrompt,
   * CallTool, ...). Close it when done (`await episode.close()`, or
   * `await using episode = ...`). A creation refused by a draining server
   * is made again under a new session id (see `episode.sessionId`).
   */
  async createEpisode(task: TaskSource, options: EpisodeOptions = {}): Promise<Episode> {
    return whileDraining(async (retry) => {
      const sessionId = (retry === 0 ? options.sessionId : undefined) ?? randomUUID();
      const route = { connection: this.connection, sessionId, routeKey: sessionId };
      const request = createEpisodeRequest(sessionId, this.name, task, options);
      await rpc(this.service.createEpisode(request, this.connection.routed(sessionId)));
      return new Episode(route);
    });
  }

  private get service() {
    return this.connection.service;
  }
}
