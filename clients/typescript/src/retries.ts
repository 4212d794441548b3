// RPCs that are safe to repeat are sent again when their connection broke or
// the server answered UNAVAILABLE, as the Python client's service config
// does: up to `attempts` tries, backing off from 0.1 s to 2 s; and while the
// server says the environment is still starting, after its retry-after, for
// up to `startingLimitMs`.
import { setTimeout as sleep } from "node:timers/promises";
import { Code, type Interceptor } from "@connectrpc/connect";
import { ORSError } from "./errors.js";
import { isStarting, pauseWhileStarting } from "./starting.js";
import { backoffMs, isBreak } from "./tasks.js";

/** Unary RPCs that do nothing twice when repeated (not CreateEpisode; streams reattach instead). */
const SAFE_TO_REPEAT = new Set([
  "Health",
  "Version",
  "ListEnvironments",
  "ListTools",
  "ListSplits",
  "ListTasks",
  "NumTasks",
  "GetTask",
  "GetTaskRange",
  "CreateSessionId",
  "GetPrompt",
  "GetMessages",
  "ListTaskTools",
  "Ping",
  "DeleteEpisode",
  "DeleteSessionId",
]);

export function retryInterceptor(attempts: number, startingLimitMs: number): Interceptor {
  return (next) => async (request) => {
    if (request.stream || !SAFE_TO_REPEAT.has(request.method.name)) return next(request);
    const startingDeadline = Date.now() + startingLimitMs;
    for (let attempt = 1; ; attempt += 1) {
      try {
        return await next(request);
      } catch (error) {
        const failure = ORSError.from(error);
        if (isStarting(failure)) {
          if (Date.now() >= startingDeadline) throw error;
          await pauseWhileStarting(failure, request.signal);
          attempt = 0; // a "still starting" answer is no failure of the connection
          continue;
        }
        const retryable = failure.code === Code.Unavailable || isBreak(failure, request.signal);
        if (!retryable || attempt >= attempts) throw error;
        await sleep(backoffMs(attempt - 1), undefined, { signal: request.signal });
      }
    }
  };
}
