// The ORS HTTP API as the page calls it: plain fetch, the API key held in
// this module's memory only (never stored), SSE read from the response body.

import { API_KEY_HEADER, SESSION_ID_HEADER } from "./constants.js";

let apiKey = "";

/** An HTTP answer other than 2xx: its status and the server's `detail`. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
    this.detail = detail;
  }
}

export function setApiKey(key) {
  apiKey = key;
}

function headers({ sessionId, json } = {}) {
  const result = {};
  if (apiKey) result[API_KEY_HEADER] = apiKey;
  if (sessionId) result[SESSION_ID_HEADER] = sessionId;
  if (json) result["Content-Type"] = "application/json";
  return result;
}

async function failure(response) {
  let detail = response.statusText;
  try {
    const body = await response.json();
    detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
  } catch {
    // Not JSON: keep the status text.
  }
  return new ApiError(response.status, detail);
}

export async function getJson(path, { sessionId } = {}) {
  const response = await fetch(path, { headers: headers({ sessionId }) });
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function postJson(path, body, { sessionId } = {}) {
  const response = await fetch(path, {
    method: "POST",
    headers: headers({ sessionId, json: true }),
    body: JSON.stringify(body ?? {}),
  });
  if (!response.ok) throw await failure(response);
  return response.json();
}

/** SSE events (`{event, data}`) from a text stream, as ORS sends them. */
export async function* sseEvents(stream) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = "message";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let newline;
    while ((newline = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, newline).replace(/\r$/, "");
      buffer = buffer.slice(newline + 1);
      if (line === "") {
        if (data.length) yield { event, data: data.join("\n") };
        event = "message";
        data = [];
      } else if (line.startsWith(":")) {
        continue; // a keepalive comment
      } else {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event = text;
        else if (field === "data") data.push(text);
      }
    }
  }
}

/**
 * A task route (`/call`, `/score_group`): `onTaskId(id)` when the task id
 * arrives, then the parsed `end` payload, or an Error for an `error` event
 * or a stream that ended early.
 */
export async function postTask(path, body, { sessionId, onTaskId }) {
  const response = await fetch(path, {
    method: "POST",
    headers: { ...headers({ sessionId, json: true }), Accept: "text/event-stream" },
    body: JSON.stringify(body),
  });
  if (!response.ok) throw await failure(response);
  let payload = "";
  for await (const { event, data } of sseEvents(response.body)) {
    if (event === "task_id") onTaskId(data);
    else if (event === "chunk") payload += data;
    else if (event === "end") return JSON.parse(payload + data);
    else if (event === "error") throw new TaskError(data);
  }
  throw new TaskError("the stream ended before the result");
}

/** An SSE `error` event: the tool (or the grader) raised. */
export class TaskError extends Error {}
