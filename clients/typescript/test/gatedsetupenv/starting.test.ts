// Calls made while an episode's setup still runs, against `gatedsetupenv`
// (tests/support/gated_setup_env.py) served with a short `--setup-wait`: its setup
// ends when this test creates the file ORS_TEST_SETUP_GATE. The server
// answers such calls ENVIRONMENT_STARTING; the client asks again.
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { after, test } from "node:test";
import { ErrorReason, ORSClient, ORSError, textOf } from "../../src/index.js";
import { TARGET, clientOptions } from "../server.js";

const ENV_NAME = "gatedsetupenv";
const GATE = process.env.ORS_TEST_SETUP_GATE ?? assert.fail("ORS_TEST_SETUP_GATE names the setup gate file");
const client = new ORSClient(TARGET, clientOptions());
/** Asks once, and takes "still starting" for an answer. */
const probe = new ORSClient(TARGET, clientOptions({ retryAttempts: 1, startingRetryMs: 0 }));
after(() => {
  client.close();
  probe.close();
});

test("calls made while the environment is still starting are asked again until it is ready", async () => {
  const env = client.environment(ENV_NAME);
  const byRpc = await env.createEpisode({ split: "train", index: 1 });
  const stream = client.openEpisodeStream();
  const onStream = await stream.createEpisode(ENV_NAME, { split: "train", index: 2 });
  const another = await env.createEpisode({ split: "test", index: 0 });
  const answers = Promise.allSettled([
    byRpc.callTool("echo", { text: "by rpc" }),
    onStream.callTool("echo", { text: "on the stream" }),
    another.getPrompt(),
    onStream.getPrompt(),
  ]);

  // Two calls made one after the other, after those, are answered "still starting": so were those.
  for (const attempt of [1, 2]) {
    const answer = await probe.service
      .getPrompt({ sessionId: another.sessionId }, { headers: { "x-session-id": another.sessionId } })
      .catch(ORSError.from);
    assert.ok(answer instanceof ORSError, `attempt ${attempt}: the setup is gated, yet ${JSON.stringify(answer)}`);
    assert.equal(answer.reason, ErrorReason.ENVIRONMENT_STARTING, answer.message);
    assert.equal(answer.retryAfterSeconds, 2);
  }
  writeFileSync(GATE, "open");

  const settled = await answers;
  const values = settled.map((result) => (result.status === "fulfilled" ? result.value : assert.fail(String(result.reason))));
  assert.deepEqual(values.map((value) => textOf("blocks" in value ? value.blocks : value)), [
    "by rpc",
    "on the stream",
    "Say yes",
    "Say 42",
  ]);
  for (const episode of [byRpc, onStream, another]) await episode.close();
  await stream.close();
});
