// One client's connection: the generated service client on a Connect gRPC
// transport (HTTP/2, plaintext or TLS), with the API key on every call.
import type { Client, Interceptor } from "@connectrpc/connect";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { EnvironmentService } from "./gen/ors/v1/environment_service_pb.js";
import { retryInterceptor } from "./retries.js";

/** The server's default message size limit (`--max-message-bytes`). */
const DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024;
const DEFAULT_REATTACH_ATTEMPTS = 5;
const DEFAULT_RETRY_ATTEMPTS = 5;
const DEFAULT_STARTING_RETRY_MS = 10 * 60 * 1000;

/** Trust settings for a TLS connection (Node's `tls.connect` options of the same names). */
export interface TlsOptions {
  /** PEM certificate(s) to trust instead of Node's default CAs (for a self-signed server). */
  ca?: string | Buffer;
  /** A PEM client certificate and its key, for servers that ask for one. */
  cert?: string | Buffer;
  key?: string | Buffer;
  /** The name to verify the server's certificate against, when it differs from the target's host. */
  servername?: string;
}

export interface ORSClientOptions {
  /** Sent as `x-api-key` metadata on every call (servers started with `--api-key`). */
  apiKey?: string;
  /** Connect over TLS (`true`: trust Node's default CAs). */
  tls?: boolean | TlsOptions;
  /** Largest message sent or received, in bytes (default 32 MiB, as the server). */
  maxMessageBytes?: number;
  /** How many times a tool call whose stream broke is attached to again by its task id (default 5). */
  reattachAttempts?: number;
  /**
   * How many times an RPC that is safe to repeat (discovery, GetPrompt,
   * ListTaskTools, Ping, the deletes; not CreateEpisode) is tried when its
   * connection broke or the server answered UNAVAILABLE (default 5).
   */
  retryAttempts?: number;
  /**
   * For how long a call answered "environment still starting"
   * (ENVIRONMENT_STARTING: the episode's setup outlasted the server's
   * `--setup-wait`) is asked again, after the server's retry-after (default
   * 10 minutes; 0 never asks again).
   */
  startingRetryMs?: number;
}

export class Connection {
  readonly service: Client<typeof EnvironmentService>;
  readonly reattachAttempts: number;
  readonly startingRetryMs: number;
  /**
   * The server ran a CallTool under the idempotency key it was given (its
   * task id was the key): a call whose stream breaks before its task id
   * arrives may then be sent again with the same key, and runs once.
   */
  honoursIdempotencyKeys = false;
  private readonly sessions: Http2SessionManager;

  /** `target` is `host:port`, as for every gRPC client. */
  constructor(target: string, options: ORSClientOptions = {}) {
    const tls = options.tls === true ? {} : options.tls || undefined;
    const baseUrl = `${tls ? "https" : "http"}://${target}`;
    const maxBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    this.sessions = new Http2SessionManager(baseUrl, {}, tls ?? {});
    this.startingRetryMs = options.startingRetryMs ?? DEFAULT_STARTING_RETRY_MS;
    const interceptors = [retryInterceptor(options.retryAttempts ?? DEFAULT_RETRY_ATTEMPTS, this.startingRetryMs)];
    if (options.apiKey !== undefined) interceptors.push(apiKeyInterceptor(options.apiKey));
    const transport = createGrpcTransport({
      baseUrl,
      sessionManager: this.sessions,
      interceptors,
      readMaxBytes: maxBytes,
      writeMaxBytes: maxBytes,
    });
    this.service = createClient(EnvironmentService, transport);
    this.reattachAttempts = options.reattachAttempts ?? DEFAULT_REATTACH_ATTEMPTS;
  }

  /** Call options that route a call by session (`x-session-id`, for load balancers). */
  routed(routeKey: string, signal?: AbortSignal): { headers: Record<string, string>; signal?: AbortSignal } {
    const headers = { "x-session-id": routeKey };
    return signal === undefined ? { headers } : { headers, signal };
  }

  /** Closes the HTTP/2 connection, ending the calls still open on it. */
  close(): void {
    this.sessions.abort();
  }
}

function apiKeyInterceptor(apiKey: string): Interceptor {
  return (next) => (request) => {
    request.header.set("x-api-key", apiKey);
    return next(request);
  };
}
