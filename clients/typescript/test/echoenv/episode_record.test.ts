// The episode record (GetEpisodeRecord) of an `echoenv` episode: during the
// episode, after it closed, and by session id. Run by tests/client/test_typescript.py.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { ORSClient } from "../../src/index.js";
import { TARGET, clientOptions } from "../server.js";

const client = new ORSClient(TARGET, clientOptions());
const env = client.environment("echoenv");
after(() => client.close());

test("episodeRecord tells every call, live and during the linger after close", async () => {
  const episode = await env.createEpisode({ spec: { question: "Say 42", answer: "42" } }, { secrets: { TOKEN: "s3cr3t" } });
  await episode.callTool("echo", { text: "my s3cr3t" });
  const live = await episode.episodeRecord();
  await episode.callTool("submit", { answer: "42" });
  await episode.close();
  const ended = await episode.episodeRecord();

  assert.equal(live.ended, null);
  assert.deepEqual(live.calls.map((call) => [call.toolName, call.input]), [["echo", { text: "my ***" }]]);
  assert.equal(ended.ended, "deleted");
  assert.deepEqual(ended.task, { question: "Say 42", answer: "42" });
  assert.deepEqual(
    ended.calls.map((call) => [call.toolName, call.reward, call.finished, call.refusalReason]),
    [["echo", null, false, null], ["submit", 1, true, null]],
  );
  assert.deepEqual(ended.totals, { calls: 2, rewardSum: 1, lastReward: 1, finished: true });
  assert.deepEqual(await client.episodeRecord(episode.sessionId), ended);
});
