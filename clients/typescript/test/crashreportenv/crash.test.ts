// The call in flight when its environment's process dies answers
// ENVIRONMENT_CRASHED (an ORSError, gRPC ABORTED), by RPC and on a RunEpisode
// stream, never a ToolFailedError. The server hosts CrashReportEnv
// (tests/support/crash_report_env.py), whose `crash_in_flight` tools answer
// as such a call does (tests/client/test_typescript.py starts it).
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Code } from "@connectrpc/connect";
import { ErrorReason, ORSClient, ORSError, ToolFailedError } from "../../src/index.js";
import { TARGET, clientOptions } from "../server.js";

const client = new ORSClient(TARGET, clientOptions());
const TOOLS = ["crash_in_flight", "crash_in_flight_later"];

after(() => client.close());

async function crashed(call: Promise<unknown>): Promise<void> {
  const error = await call.then(
    () => assert.fail("expected the call to be answered ENVIRONMENT_CRASHED"),
    (thrown: unknown) => thrown,
  );
  assert.ok(!(error instanceof ToolFailedError), `a tool failure: ${String(error)}`);
  assert.ok(error instanceof ORSError, `not an ORSError: ${String(error)}`);
  assert.equal(error.reason, ErrorReason.ENVIRONMENT_CRASHED);
  assert.equal(error.code, Code.Aborted);
  assert.match(error.detail, /killed by SIGSEGV/);
}

test("by RPC, the call in flight answers ENVIRONMENT_CRASHED", async () => {
  const episode = await client.environment("crashreportenv").createEpisode({ split: "train", index: 0 });
  for (const tool of TOOLS) await crashed(episode.callTool(tool));
  await episode.close();
});

test("on a RunEpisode stream, the call in flight answers ENVIRONMENT_CRASHED", async () => {
  const stream = client.openEpisodeStream();
  const episode = await stream.createEpisode("crashreportenv", { split: "train", index: 0 });
  for (const tool of TOOLS) await crashed(episode.callTool(tool));
  await stream.close();
});
