// Episodes over one RunEpisode stream: each step is one request answered by
// one response, in order; after an episode's `delete` step the stream can
// carry the next episode.
import { randomUUID } from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import type { Connection } from "./connection.js";
import { Episode, ORSEpisode } from "./episode.js";
import { whileDraining } from "./draining.js";
import { ORSError, rpc } from "./errors.js";
import type { RunEpisodeRequestSchema, RunEpisodeResponse } from "./gen/ors/v1/environment_service_pb.js";
import { ErrorReason } from "./gen/ors/v1/errors_pb.js";
import { createEpisodeRequest, type EpisodeOptions } from "./requests.js";
import { candidateInit, toMessage, toToolListing, type GroupCandidate, type GroupScore, type Message, type ToolListing } from "./messages.js";
import { isBreak, reattach, runTask, type SessionRoute, type TaskEvent, type TaskOptions, type TaskRun } from "./tasks.js";
import { whileStarting } from "./starting.js";
import { scoring, toolCall } from "./tool_calls.js";
import { jsonValue, toBlock, type Block, type JsonObject, type TaskSource, type ToolOutput } from "./types.js";

type Step = MessageInitShape<typeof RunEpisodeRequestSchema>["step"];
type Answer = RunEpisodeResponse["step"];
type AnswerCase = Exclude<Answer["case"], "error" | undefined>;
type AnswerOf<K extends AnswerCase> = Extract<Answer, { case: K }>["value"];

/** Opened by `ORSClient.openEpisodeStream()`. Steps run one at a time, in call order. */
export class EpisodeStream implements AsyncDisposable {
  private requests = new RequestQueue<{ step: Step }>();
  private answers: AsyncIterator<RunEpisodeResponse> | undefined;
  private cancel = new AbortController();
  private turn: Promise<unknown> = Promise.resolve();
  private broken: ORSError | undefined;

  /** The route key as the server answered it (its initial metadata), once it did. */
  private answeredKey: string | undefined;

  /**
   * `routeKey` is the `x-session-id` the stream opens with: a load balancer
   * keeps the whole stream, so every episode on it, on the backend that key
   * chooses, and the episodes' own RPCs (attach, ping) send it too. Once the
   * server answered, it is the key in its answer: behind Envoy with stateful
   * sessions that names the backend the stream reached, so those RPCs reach
   * it even after the backends changed (docs/deployment.md).
   */
  constructor(
    private readonly connection: Connection,
    private key: string = randomUUID(),
  ) {}

  /** The `x-session-id` of the stream's episodes' RPCs (a new one after a draining server refused an episode). */
  get routeKey(): string {
    return this.answeredKey ?? this.key;
  }

  /** Why the stream broke (it then carries no more steps), if it did. */
  get failure(): ORSError | undefined {
    return this.broken;
  }

  /**
   * Starts an episode of `envName` on this stream (a `create` step). When
   * the server is draining, the stream (which holds no episode then) is
   * opened again under a new route key, and the episode created there under
   * a new session id.
   */
  async createEpisode(envName: string, task: TaskSource, options: EpisodeOptions = {}): Promise<StreamEpisode> {
    return whileDraining(async (retry) => {
      if (retry > 0) this.reopen();
      const sessionId = (retry === 0 ? options.sessionId : undefined) ?? randomUUID();
      const request = createEpisodeRequest(sessionId, envName, task, options);
      await this.step({ case: "create", value: request }, "create");
      return new StreamEpisode(this, { connection: this.connection, sessionId, routeKey: this.routeKey });
    });
  }

  /** Ends the call (it holds no episode) and starts afresh under a new route key: the next step opens a new call. */
  private reopen(): void {
    this.requests.end();
    this.cancel.abort();
    this.requests = new RequestQueue<{ step: Step }>();
    this.cancel = new AbortController();
    this.answers = undefined;
    this.broken = undefined;
    this.key = randomUUID();
    this.answeredKey = undefined;
  }

  /** Sends one step and resolves to its answer; a failed step rejects with its ORSError. */
  step<K extends AnswerCase>(step: Step, expected: K): Promise<AnswerOf<K>> {
    const answer = this.turn.then(() => this.exchange(step, expected));
    this.turn = answer.catch(() => {});
    return answer;
  }

  /** Ends the stream, leaving any open episode open (reachable by its RPCs). */
  abort(reason?: unknown): void {
    this.cancel.abort(reason);
  }

  /** Half-closes the stream and waits for the server to end it. */
  async close(): Promise<void> {
    this.requests.end();
    await this.turn;
    if (this.answers === undefined || this.broken !== undefined) return;
    try {
      while (!(await this.answers.next()).done);
    } catch (error) {
      throw ORSError.from(error);
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  private async exchange<K extends AnswerCase>(step: Step, expected: K): Promise<AnswerOf<K>> {
    if (this.broken !== undefined) throw this.broken;
    this.requests.push({ step });
    let next: IteratorResult<RunEpisodeResponse>;
    try {
      next = await this.openedAnswers().next();
    } catch (error) {
      throw (this.broken = ORSError.from(error));
    }
    if (next.done) {
      throw (this.broken = new ORSError(Code.Unavailable, ErrorReason.UNSPECIFIED, "the RunEpisode stream ended before answering"));
    }
    const answer = next.value.step;
    if (answer.case === "error") throw ORSError.fromStepError(answer.value);
    if (answer.case !== expected) {
      throw new ORSError(Code.Internal, ErrorReason.UNSPECIFIED, `expected a ${expected} answer, got ${answer.case}`);
    }
    return answer.value as AnswerOf<K>;
  }

  /**
   * The call's answers, opening it with the first step: a call is only
   * opened to be read at once, so its failure is always someone's rejection.
   */
  private openedAnswers(): AsyncIterator<RunEpisodeResponse> {
    if (this.answers === undefined) {
      const options = {
        ...this.connection.routed(this.key, this.cancel.signal),
        onHeader: (headers: Headers) => {
          this.answeredKey = headers.get("x-session-id") ?? undefined;
        },
      };
      this.answers = this.connection.service.runEpisode(this.requests, options)[Symbol.asyncIterator]();
    }
    return this.answers;
  }
}

/**
 * An episode on a RunEpisode stream. Its steps go on the stream; once the
 * stream broke they go by their own RPCs (a step caught by the break is
 * repeated that way, and a tool call or scoring is attached to by its task
 * id, so it runs once).
 */
export class StreamEpisode extends ORSEpisode {
  private readonly byRpc: Episode;
  private closed = false;

  /** Use `EpisodeStream.createEpisode`. */
  constructor(
    private readonly stream: EpisodeStream,
    route: SessionRoute,
  ) {
    super(route);
    this.byRpc = new Episode(route);
  }

  getPrompt(): Promise<Block[]> {
    return this.onStream(
      async () => (await this.stream.step({ case: "getPrompt", value: {} }, "getPrompt")).blocks.map(toBlock),
      () => this.byRpc.getPrompt(),
    );
  }

  getMessages(): Promise<Message[]> {
    return this.onStream(
      async () => (await this.stream.step({ case: "getMessages", value: {} }, "getMessages")).messages.map(toMessage),
      () => this.byRpc.getMessages(),
    );
  }

  /** A call made here carries a task id this client chose, so even a break before any answer is attached to. */
  callTool(name: string, input: JsonObject = {}, options: TaskOptions = {}): Promise<ToolOutput> {
    return this.stepTask(
      (taskId) => this.stream.step({ case: "callTool", value: { name, input: jsonValue(input), taskId } }, "callTool"),
      toolCall(this.route, name, input),
      options,
    );
  }

  scoreGroup(candidates: (GroupCandidate | Message[])[], options: TaskOptions = {}): Promise<GroupScore[]> {
    return this.stepTask(
      (taskId) => this.stream.step({ case: "scoreGroup", value: { candidates: candidates.map(candidateInit), taskId } }, "scoreGroup"),
      scoring(this.route, candidates),
      options,
    );
  }

  /**
   * The `delete` step (after which the stream may carry another episode); once
   * the stream broke, DeleteEpisode (what the step does: the episode's id was
   * never minted by CreateSessionId). Safe to call twice.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    await this.onStream(
      async () => void (await this.stream.step({ case: "delete", value: {} }, "delete")),
      async () => void (await rpc(this.service.deleteEpisode({ sessionId: this.sessionId }, this.routed()))),
    );
    this.closed = true;
    // The server takes the stream's key for an episode only while it exists:
    // later calls name the deleted episode itself, and get SESSION_NOT_FOUND.
    this.route.routeKey = this.route.sessionId;
  }

  protected fetchToolListing(): Promise<ToolListing> {
    return this.onStream(
      async () => toToolListing(await this.stream.step({ case: "listTaskTools", value: {} }, "listTaskTools")),
      () => this.byRpc.toolListing(),
    );
  }

  /** A step on the stream, asked again while the environment is still starting; by RPC once the stream broke. */
  private onStream<T>(viaStream: () => Promise<T>, viaRpc: () => Promise<T>): Promise<T> {
    return whileStarting(() => this.onStreamOnce(viaStream, viaRpc), this.route.connection.startingRetryMs);
  }

  private async onStreamOnce<T>(viaStream: () => Promise<T>, viaRpc: () => Promise<T>): Promise<T> {
    if (this.stream.failure === undefined) {
      try {
        return await viaStream();
      } catch (error) {
        if (error !== this.stream.failure) throw error;
      }
    }
    return viaRpc();
  }

  /**
   * Work with a task id as a step under an id chosen here. Aborting `signal`
   * ends the stream (steps are answered in order, so one cannot be left
   * behind); the work runs on, and later steps go by RPC.
   */
  private stepTask<T, E extends TaskEvent>(ask: (taskId: string) => Promise<E>, run: TaskRun<T, E>, options: TaskOptions): Promise<T> {
    // A step refused as "still starting" never ran: it is asked again under a fresh task id.
    return whileStarting(() => this.stepTaskOnce(ask, run, options), this.route.connection.startingRetryMs, options.signal);
  }

  private async stepTaskOnce<T, E extends TaskEvent>(ask: (taskId: string) => Promise<E>, run: TaskRun<T, E>, options: TaskOptions): Promise<T> {
    if (this.stream.failure !== undefined) return runTask(this.route, run, options);
    const taskId = randomUUID();
    const abort = () => this.stream.abort(options.signal?.reason);
    if (options.signal?.aborted) abort();
    options.signal?.addEventListener("abort", abort, { once: true });
    options.onTaskId?.(taskId);
    try {
      return run.outcome((await ask(taskId)).event);
    } catch (error) {
      if (error !== this.stream.failure || !isBreak(error, options.signal)) throw error;
      return this.reattach(run, taskId, error, options.signal);
    } finally {
      options.signal?.removeEventListener("abort", abort);
    }
  }

  private async reattach<T, E extends TaskEvent>(run: TaskRun<T, E>, taskId: string, broke: ORSError, signal?: AbortSignal): Promise<T> {
    try {
      return await reattach(this.route, run, taskId, broke, signal);
    } catch (error) {
      if (!(error instanceof ORSError) || error.reason !== ErrorReason.UNKNOWN_TASK_ID) throw error;
      const detail = `the episode stream broke before the server got the step: task ${taskId} did not run`;
      throw new ORSError(Code.Unavailable, ErrorReason.UNKNOWN_TASK_ID, detail, { cause: error });
    }
  }
}

/** The requests of a stream: an async iterable that waits for the next one pushed, until ended. */
class RequestQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private ended = false;
  private wake: () => void = () => {};

  push(item: T): void {
    this.items.push(item);
    this.wake();
  }

  end(): void {
    this.ended = true;
    this.wake();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    for (;;) {
      const item = this.items.shift();
      if (item !== undefined) yield item;
      else if (this.ended) return;
      else await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }
}
