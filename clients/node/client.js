// A small Node.js client of the ORS gRPC service (ors.v1.EnvironmentService).
//
// It loads proto/ors/v1/*.proto at run time with @grpc/proto-loader (no code
// generation step) and wraps the service in promises. Session-scoped calls
// send the session id in the request and as `x-session-id` metadata (for
// load-balancer affinity); an API key travels as `x-api-key` metadata.
"use strict";

const path = require("node:path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTO_ROOT = path.resolve(__dirname, "..", "..", "proto");
const MAX_MESSAGE_BYTES = 32 * 1024 * 1024;

// keepCase: field names as in the .proto (session_id). longs: Number is safe
// here, ORS int64 fields are counts and indexes. oneofs: adds a virtual field
// naming the set member (e.g. `event: "task_id"`), and for proto3 `optional`
// fields (`_reward: "reward"`) which tells unset from 0.
const LOADER_OPTIONS = {
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTO_ROOT],
};

function loadService() {
  const definition = protoLoader.loadSync(["ors/v1/environment_service.proto"], LOADER_OPTIONS);
  return grpc.loadPackageDefinition(definition).ors.v1.EnvironmentService;
}

// A failed RPC: `reason` is the ErrorReason name from the `ors-error-reason`
// trailing metadata entry (ERROR_REASON_UNSPECIFIED when absent).
class ORSError extends Error {
  constructor(grpcError) {
    const reason = grpcError.metadata?.get("ors-error-reason")[0] ?? "ERROR_REASON_UNSPECIFIED";
    super(`${reason} (${grpc.status[grpcError.code]}): ${grpcError.details}`);
    this.code = grpcError.code;
    this.reason = String(reason);
    this.details = grpcError.details;
  }
}

const jsonValue = (value) => ({ json: JSON.stringify(value) });
// Note: JSON.parse turns integers beyond 2^53 into imprecise numbers; parse
// `.json` with a big-number aware parser if a task spec may hold such values.
const parseJson = (message) => (message ? JSON.parse(message.json) : null);

// A Block message as ORS JSON ({type: "text"|"image", ...}); image data stays raw bytes (a Buffer).
function decodeBlock(block) {
  if (block.block === "text") {
    return { type: "text", text: block.text.text, detail: parseJson(block.text.detail) };
  }
  return {
    type: "image",
    data: block.image.data,
    mimeType: block.image.mime_type,
    detail: parseJson(block.image.detail),
  };
}

function decodeToolOutput(output) {
  return {
    blocks: output.blocks.map(decodeBlock),
    metadata: parseJson(output.metadata),
    reward: output._reward === "reward" ? output.reward : null,
    finished: output.finished,
  };
}

class ORSClient {
  constructor(target, { apiKey, credentials } = {}) {
    const Service = loadService();
    this.apiKey = apiKey;
    this.stub = new Service(target, credentials ?? grpc.credentials.createInsecure(), {
      "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
      "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
    });
  }

  metadata(sessionId) {
    const metadata = new grpc.Metadata();
    if (this.apiKey) metadata.set("x-api-key", this.apiKey);
    if (sessionId) metadata.set("x-session-id", sessionId);
    return metadata;
  }

  // Calls a unary RPC by its proto name (e.g. "GetPrompt"); rejects with ORSError.
  unary(method, request = {}) {
    return new Promise((resolve, reject) => {
      this.stub[method](request, this.metadata(request.session_id), (error, response) =>
        error ? reject(new ORSError(error)) : resolve(response),
      );
    });
  }

  // Runs a tool (or attaches to a call with `taskId`). Resolves to
  // {taskId, ok: true, output} | {taskId, ok: false, error} (tool-level error)
  // | {taskId, failure} (the tool raised).
  callTool(sessionId, name, input = {}, taskId = "") {
    const request = { session_id: sessionId, call: { name, input: jsonValue(input), task_id: taskId } };
    return new Promise((resolve, reject) => {
      const outcome = { taskId: null };
      const stream = this.stub.CallTool(request, this.metadata(sessionId));
      stream.on("data", (event) => {
        if (event.event === "task_id") {
          outcome.taskId = event.task_id;
        } else if (event.event === "result" && event.result.outcome === "output") {
          Object.assign(outcome, { ok: true, output: decodeToolOutput(event.result.output) });
        } else if (event.event === "result") {
          Object.assign(outcome, { ok: false, error: event.result.error });
        } else if (event.event === "failure") {
          outcome.failure = event.failure.message;
        }
      });
      stream.on("error", (error) => reject(new ORSError(error)));
      stream.on("end", () => resolve(outcome));
    });
  }

  // A RunEpisode stream for a new episode (see EpisodeStream).
  episodeStream(sessionId) {
    return new EpisodeStream(this.stub.RunEpisode(this.metadata(sessionId)));
  }

  close() {
    this.stub.close();
  }
}

// One RunEpisode call: `step(request)` writes one step and resolves to its
// one answer (answers come in order); a step that failed answers with
// `{step: "error", error: {code, reason, message}}`. `end()` half-closes and
// resolves when the server ended the stream.
class EpisodeStream {
  constructor(call) {
    this.call = call;
    this.waiting = [];
    this.ended = new Promise((resolve, reject) => {
      call.on("end", resolve);
      call.on("error", (error) => {
        const failure = new ORSError(error);
        for (const { reject: fail } of this.waiting.splice(0)) fail(failure);
        reject(failure);
      });
    });
    this.ended.catch(() => {}); // also reported to every waiting step
    call.on("data", (answer) => this.waiting.shift().resolve(answer));
  }

  step(request) {
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      this.call.write(request);
    });
  }

  end() {
    this.call.end();
    return this.ended;
  }
}

module.exports = { EpisodeStream, ORSClient, ORSError, decodeBlock, decodeToolOutput, jsonValue, parseJson };
