// Warm episodes (Environment.prepare) and exactly-once tool calls (CallTool's
// idempotency key) against a server hosting CountingWarmEnv
// (tests/support/counting_warm_env.py). Its setups are numbered and recorded, one
// line each, in the `events` file of ORS_TEST_MARKER_DIR; an episode's prompt
// names the setup that built it.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { ORSClient, ORSError, textOf, type JsonObject, type TaskSource } from "../../src/index.js";
import { BreakingProxy } from "../breaking_proxy.js";
import { TARGET, clientOptions } from "../server.js";

const ENV_NAME = "countingwarmenv";
const MARKER_DIR = process.env.ORS_TEST_MARKER_DIR;
const WAIT_MS = 20_000;

const client = new ORSClient(TARGET, clientOptions());
const env = client.environment(ENV_NAME);
let proxy: BreakingProxy;

before(async () => {
  proxy = await BreakingProxy.start(TARGET);
});
after(async () => {
  client.close();
  await proxy.stop();
});

/** The setups the server recorded of the task tagged `tag`, by number. */
function setupsOf(tag: string): number[] {
  assert.ok(MARKER_DIR, "ORS_TEST_MARKER_DIR names the server's events folder");
  const path = join(MARKER_DIR, "events");
  const lines = existsSync(path) ? readFileSync(path, "utf8").split("\n") : [];
  return lines.flatMap((line) => {
    const [kind, lineTag, number] = line.split(" ");
    return kind === "setup" && lineTag === tag ? [Number(number)] : [];
  });
}

/** Waits until the server recorded `count` setups of `tag`; their numbers. */
async function untilSetups(tag: string, count: number): Promise<number[]> {
  const deadline = Date.now() + WAIT_MS;
  while (setupsOf(tag).length < count) {
    assert.ok(Date.now() < deadline, `timed out waiting for ${count} setup(s) of ${tag}`);
    await sleep(50);
  }
  return setupsOf(tag);
}

/** The prompt of a new episode of `task` ("setup N of TAG": the setup that built it). */
async function promptOf(task: TaskSource, secrets?: Record<string, string>): Promise<string> {
  await using episode = await env.createEpisode(task, secrets === undefined ? {} : { secrets });
  return textOf(await episode.getPrompt());
}

describe("warm episodes", () => {
  test("a prepared episode is claimed: its setup ran once, before the create", async () => {
    const task: JsonObject = { tag: "ts-a", n: 1 };
    const prepared = await env.prepare([task]);
    assert.equal(prepared.preparing, 1);
    assert.ok(prepared.ttlSeconds > 0, String(prepared.ttlSeconds));
    const [setup] = await untilSetups("ts-a", 1);
    // Another key order is the same canonical task.
    assert.equal(await promptOf({ spec: { n: 1, tag: "ts-a" } }), `setup ${setup} of ts-a`);
    assert.deepEqual(setupsOf("ts-a"), [setup]);
    // Claimed once only: the next episode of the task is set up anew.
    const fresh = await promptOf({ spec: task });
    assert.notEqual(fresh, `setup ${setup} of ts-a`);
    assert.equal(setupsOf("ts-a").length, 2);
  });

  test("by split and indices, claimed only with the same secrets, also on a stream", async () => {
    const secrets = { TOKEN: "one" };
    assert.deepEqual((await env.prepare({ split: "train", indices: [2, 2] }, { secrets })).preparing, 2);
    const prepared = await untilSetups("indexed-2", 2);
    const task = { split: "train", index: 2 };
    const other = await promptOf(task, { TOKEN: "two" });
    assert.ok(!prepared.some((number) => other === `setup ${number} of indexed-2`), other);
    assert.equal(setupsOf("indexed-2").length, 3, "other secrets set up an episode of their own");

    const claimed = [await promptOf(task, secrets)];
    await using stream = client.openEpisodeStream();
    await using onStream = await stream.createEpisode(ENV_NAME, task, { secrets });
    claimed.push(textOf(await onStream.getPrompt()));
    assert.deepEqual(claimed.sort(), prepared.map((number) => `setup ${number} of indexed-2`).sort());
    assert.equal(setupsOf("indexed-2").length, 3);
  });

  test("episodes reserved for session ids are claimed only under those ids, by RPC and on a stream", async () => {
    const task = { spec: { tag: "ts-reserved" } };
    const [byRpc, onStream] = [randomUUID(), randomUUID()];
    assert.equal((await env.prepare([task.spec, task.spec], { sessionIds: [byRpc, onStream] })).preparing, 2);
    const prepared = (await untilSetups("ts-reserved", 2)).map((number) => `setup ${number} of ts-reserved`);
    const byTask = await promptOf(task); // another id: it claims neither
    assert.ok(!prepared.includes(byTask), byTask);

    await using first = await env.createEpisode(task, { sessionId: byRpc });
    await using stream = client.openEpisodeStream(onStream); // routed by the reserved id
    await using second = await stream.createEpisode(ENV_NAME, task, { sessionId: onStream });
    assert.equal(second.sessionId, onStream);
    const claimed = [textOf(await first.getPrompt()), textOf(await second.getPrompt())];
    assert.deepEqual(claimed.sort(), prepared.sort());
    assert.equal(setupsOf("ts-reserved").length, 3);
  });

  test("a prepare naming no task is refused", async () => {
    await assert.rejects(env.prepare([]), (error) => error instanceof ORSError && error.reasonName === "ERROR_REASON_INVALID_REQUEST");
  });
});

describe("exactly-once tool calls", () => {
  test("a call whose stream broke before its task id is sent again under its key, and runs once", async () => {
    using proxied = new ORSClient(proxy.target, clientOptions());
    await using episode = await proxied.environment(ENV_NAME).createEpisode({ spec: { tag: "ts-once", setup_s: 0 } });
    assert.equal(textOf((await episode.callTool("count")).blocks), "1"); // the server shows it honours keys
    const dropped = proxy.dropNextSendAndCut();
    assert.equal(textOf((await episode.callTool("count")).blocks), "2");
    await dropped;
    assert.equal(textOf((await episode.callTool("count")).blocks), "3");
  });

  test("before the server showed it honours keys, such a call rejects rather than risk running twice", async () => {
    using proxied = new ORSClient(proxy.target, clientOptions());
    await using episode = await proxied.environment(ENV_NAME).createEpisode({ spec: { tag: "ts-unsure", setup_s: 0 } });
    const dropped = proxy.dropNextSendAndCut();
    await assert.rejects(episode.callTool("count"), (error) => error instanceof ORSError && error.reasonName === "ERROR_REASON_UNSPECIFIED");
    await dropped;
    assert.equal(textOf((await episode.callTool("count")).blocks), "1", "the broken call never ran");
  });
});
