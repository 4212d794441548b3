// Runs one full ORS episode over gRPC against a server hosting the test
// environment `echoenv` (tests/environments.py: EchoEnv), checking every answer.
//
//   node episode.js [HOST:PORT]      (or ORS_TARGET=HOST:PORT; ORS_API_KEY for a key)
//
// Prints one line per check; exits 1 on the first mismatch, 2 on an RPC error.
"use strict";

const assert = require("node:assert/strict");
const { randomUUID } = require("node:crypto");
const { ORSClient, ORSError, decodeToolOutput, jsonValue, parseJson } = require("./client");

const ENV_NAME = "echoenv";
const IMAGE_SIZE = 300;

function check(label, fn) {
  fn();
  console.log(`ok - ${label}`);
}

// The bytes EchoEnv's `image` tool makes: i % 256 for i in range(size).
const expectedImageBytes = (size) => Buffer.from(Array.from({ length: size }, (_, i) => i % 256));

async function discover(client) {
  const health = await client.unary("Health");
  check("health is ok", () => assert.equal(health.status, "ok"));
  const { names } = await client.unary("ListEnvironments");
  check("echoenv is listed", () => assert.ok(names.includes(ENV_NAME), `got ${names}`));
  const { splits } = await client.unary("ListSplits", { env_name: ENV_NAME });
  check("splits are train and test", () =>
    assert.deepEqual(splits.map((s) => [s.name, s.type]), [["train", "SPLIT_TYPE_TRAIN"], ["test", "SPLIT_TYPE_TEST"]]),
  );
  const { task } = await client.unary("GetTask", { env_name: ENV_NAME, split: "train", index: 1 });
  const spec = parseJson(task.spec);
  check("task 1 of train has its answer", () => assert.equal(spec.answer, "world"));
  return spec;
}

async function runEpisode(client, sessionId, spec) {
  await client.unary("CreateEpisode", {
    session_id: sessionId,
    env_name: ENV_NAME,
    task_index: { split: "train", index: 1 },
  });
  const { blocks } = await client.unary("GetPrompt", { session_id: sessionId });
  check("prompt is the task's question", () => {
    assert.equal(blocks.length, 1);
    assert.equal(blocks[0].text.text, spec.question);
  });
  const { tools } = await client.unary("ListTaskTools", { session_id: sessionId });
  check("task tools include echo, image, submit", () => {
    const names = tools.map((t) => t.name);
    for (const name of ["echo", "image", "submit"]) assert.ok(names.includes(name), `missing ${name}`);
  });

  const add = await client.callTool(sessionId, "add", { a: 2, b: 40 });
  check("add answers 42 with reward 0.0", () => {
    assert.match(add.taskId, /\S/);
    assert.equal(add.ok, true);
    assert.equal(add.output.blocks[0].text, "42");
    assert.equal(add.output.reward, 0);
    assert.equal(add.output.finished, false);
  });

  const unknown = await client.callTool(sessionId, "no_such_tool", {});
  check("an unknown tool is a tool-level error", () => {
    assert.equal(unknown.ok, false);
    assert.match(unknown.error, /no_such_tool/);
  });

  const failed = await client.callTool(sessionId, "fail", {});
  check("a raising tool is a failure event", () => assert.equal(failed.failure, "boom"));

  const image = await client.callTool(sessionId, "image", { size: IMAGE_SIZE });
  check("image block carries raw bytes, mime type and detail", () => {
    const [block] = image.output.blocks;
    assert.equal(block.type, "image");
    assert.equal(block.mimeType, "image/png");
    assert.deepEqual(block.detail, { size: IMAGE_SIZE });
    assert.ok(Buffer.from(block.data).equals(expectedImageBytes(IMAGE_SIZE)));
    assert.equal(image.output.reward, null);
  });

  const reattached = await client.callTool(sessionId, "image", {}, image.taskId);
  check("attaching by task id returns the same result", () => assert.deepEqual(reattached, image));

  const submit = await client.callTool(sessionId, "submit", { answer: spec.answer });
  check("submitting the answer ends the episode with reward 1", () => {
    assert.equal(submit.output.blocks[0].text, "correct");
    assert.equal(submit.output.reward, 1);
    assert.equal(submit.output.finished, true);
  });
}

// The same kind of episode over one RunEpisode stream: one answer per step.
async function runEpisodeOnOneStream(client, spec) {
  const sessionId = randomUUID(); // ours, so the stream's metadata carries it
  const stream = client.episodeStream(sessionId);
  const created = await stream.step({
    create: { session_id: sessionId, env_name: ENV_NAME, task_index: { split: "train", index: 1 } },
  });
  check("RunEpisode: create answers with our session id", () => assert.equal(created.create.session_id, sessionId));
  const prompt = await stream.step({ get_prompt: {} });
  check("RunEpisode: the prompt is the task's question", () =>
    assert.equal(prompt.get_prompt.blocks[0].text.text, spec.question),
  );
  const call = (name, input) => stream.step({ call_tool: { name, input: jsonValue(input), task_id: randomUUID() } });
  const added = await call("add", { a: 40, b: 2 });
  check("RunEpisode: a call_tool step answers with the call's result", () =>
    assert.equal(decodeToolOutput(added.call_tool.result.output).blocks[0].text, "42"),
  );
  const refused = await stream.step({ get_prompt: { session_id: "someone-else" } });
  check("RunEpisode: a failed step answers with a StepError and the stream goes on", () => {
    assert.equal(refused.step, "error");
    assert.equal(refused.error.reason, "ERROR_REASON_INVALID_REQUEST");
    assert.equal(refused.error.code, 3); // INVALID_ARGUMENT
  });
  const submitted = await call("submit", { answer: spec.answer });
  check("RunEpisode: submitting ends the episode with reward 1", () => {
    const output = decodeToolOutput(submitted.call_tool.result.output);
    assert.equal(output.reward, 1);
    assert.equal(output.finished, true);
  });
  const deleted = await stream.step({ delete: {} });
  check("RunEpisode: the delete step ends the episode", () => assert.equal(deleted.delete.session_id, sessionId));
  await stream.end();
  await expectSessionGone(client, sessionId);
}

async function expectSessionGone(client, sessionId) {
  try {
    await client.unary("GetPrompt", { session_id: sessionId });
  } catch (error) {
    check("a deleted session is not found", () => {
      assert.ok(error instanceof ORSError, String(error));
      assert.equal(error.reason, "ERROR_REASON_SESSION_NOT_FOUND");
    });
    return;
  }
  assert.fail("GetPrompt on a deleted session succeeded");
}

async function main() {
  const target = process.argv[2] ?? process.env.ORS_TARGET ?? "127.0.0.1:50051";
  const client = new ORSClient(target, { apiKey: process.env.ORS_API_KEY });
  try {
    const spec = await discover(client);
    const { session_id: sessionId } = await client.unary("CreateSessionId");
    try {
      await runEpisode(client, sessionId, spec);
    } finally {
      await client.unary("DeleteEpisode", { session_id: sessionId });
      await client.unary("DeleteSessionId", { session_id: sessionId });
    }
    await expectSessionGone(client, sessionId);
    await runEpisodeOnOneStream(client, spec);
    console.log("episode complete");
  } finally {
    client.close();
  }
}

main().catch((error) => {
  console.error(`not ok - ${error.message}`);
  process.exit(error instanceof assert.AssertionError ? 1 : 2);
});
