// Creations refused by a draining backend are made again elsewhere, behind a
// load balancer hashing `x-session-id` (tests/deploy/test_drain.py starts
// nginx before two backends hosting WhoAmI, tests/support/scaleout_env.py,
// and drains the one whose process id is ORS_DRAINING_PID). Every episode
// must succeed, on the other backend: each tool output names the process
// that ran it.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { ORSClient, type ORSEpisode, type ToolOutput } from "../../src/index.js";
import { TARGET, clientOptions } from "../server.js";

const DRAINING_PID = Number(process.env.ORS_DRAINING_PID);
const EPISODES = 20;
const client = new ORSClient(TARGET, clientOptions());
const env = client.environment("whoami");

after(() => client.close());

function pidOf(output: ToolOutput): number {
  return (output.metadata as { pid: number }).pid;
}

async function play(episode: ORSEpisode, index: number): Promise<number[]> {
  const sum = await episode.callTool("add", { a: index, b: 2 * index + 1 });
  const submitted = await episode.callTool("submit", { answer: 3 * index + 1 });
  assert.equal(submitted.reward, 1);
  await episode.close();
  return [pidOf(sum), pidOf(submitted)];
}

test("episodes by RPC are created on a backend that is not draining", async () => {
  assert.ok(Number.isInteger(DRAINING_PID), "ORS_DRAINING_PID names the draining backend");
  for (let index = 0; index < EPISODES; index += 1) {
    const pids = await play(await env.createEpisode({ split: "train", index }), index);
    assert.ok(pids.every((pid) => pid !== DRAINING_PID), `episode ${index} ran on the draining backend`);
  }
});

test("episodes on streams are created on a backend that is not draining", async () => {
  for (let index = 0; index < EPISODES; index += 1) {
    const stream = client.openEpisodeStream();
    const pids = await play(await stream.createEpisode("whoami", { split: "train", index }), index);
    await stream.close();
    assert.ok(pids.every((pid) => pid !== DRAINING_PID), `episode ${index} ran on the draining backend`);
  }
});
