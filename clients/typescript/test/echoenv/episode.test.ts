// Discovery and full episodes of `echoenv`, one RPC per step and on
// RunEpisode streams. Run by tests/client/test_typescript.py against
// `ors-grpc serve tests.support.environments:EchoEnv` (plain, with an API key, TLS).
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import {
  ErrorReason,
  ORSClient,
  ORSError,
  ToolCallError,
  ToolFailedError,
  textMessage,
  textOf,
  type Block,
  type ImageBlock,
} from "../../src/index.js";
import { TARGET, clientOptions } from "../server.js";

const ENV_NAME = "echoenv";

const client = new ORSClient(TARGET, clientOptions());
const env = client.environment(ENV_NAME);
after(() => client.close());

/** The bytes EchoEnv's `image` tool makes: i % 256 for i in range(size). */
const imageBytes = (size: number) => Uint8Array.from({ length: size }, (_, i) => i % 256);

function onlyImage(blocks: Block[]): ImageBlock {
  assert.equal(blocks.length, 1);
  assert.equal(blocks[0].type, "image");
  return blocks[0] as ImageBlock;
}

/** What `promise` rejects with (fails if it resolves). */
function rejection(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => assert.fail("expected a rejection"),
    (error: unknown) => error,
  );
}

/** Asserts that `promise` rejects with an ORSError of `reason`. */
async function rejectsWith(promise: Promise<unknown>, reason: ErrorReason): Promise<ORSError> {
  const error = await rejection(promise);
  assert.ok(error instanceof ORSError, String(error));
  assert.equal(error.reason, reason, error.message);
  return error;
}

describe("discovery", () => {
  test("the server is healthy and hosts echoenv", async () => {
    assert.equal((await client.health()).status, "ok");
    assert.match(await client.version(), /^\d+\.\d+/);
    assert.ok((await client.listEnvironments()).includes(ENV_NAME));
  });

  test("splits, tasks and shared tools of echoenv", async () => {
    assert.deepEqual(await env.listSplits(), [
      { name: "train", type: "train" },
      { name: "test", type: "test" },
    ]);
    assert.equal(await env.numTasks("train"), 3);
    assert.equal((await env.getTask("train", 1)).answer, "world");
    assert.deepEqual((await env.listTasks("test")).map((task) => task.id), [3, 4]);
    assert.deepEqual((await env.getTaskRange("train", 1)).map((task) => task.id), [1, 2]);
    assert.deepEqual((await env.getTaskRange("train", -1)).map((task) => task.id), [2]);
    const tools = await env.listTools();
    const add = tools.find((tool) => tool.name === "add");
    assert.equal(add?.description, "Add two integers.");
    assert.deepEqual((add?.inputSchema as { required: string[] }).required, ["a", "b"]);
    assert.ok(!tools.some((tool) => tool.name === "hint"), "hint is a task tool, not a shared one");
  });

  test("an unknown environment or split is an ORSError with its reason", async () => {
    const error = await rejectsWith(client.environment("nosuchenv").listSplits(), ErrorReason.UNKNOWN_ENVIRONMENT);
    assert.equal(error.reasonName, "ERROR_REASON_UNKNOWN_ENVIRONMENT");
    await rejectsWith(env.numTasks("nosuchsplit"), ErrorReason.INVALID_SPLIT);
  });
});

describe("an episode with one RPC per step", () => {
  test("prompt, tools, outputs, refusals, failures, images, attach by task id, submit, close", async () => {
    const episode = await env.createEpisode({ split: "train", index: 1 });
    assert.equal(textOf(await episode.getPrompt()), "Say world");
    const names = (await episode.listTools()).map((tool) => tool.name);
    for (const name of ["echo", "add", "image", "submit"]) assert.ok(names.includes(name), `missing ${name}`);

    const sum = await episode.callTool("add", { a: 2, b: 40 });
    assert.deepEqual(sum, { blocks: [{ type: "text", text: "42", detail: null }], metadata: null, reward: 0, finished: false });

    const refused = await rejection(episode.callTool("no_such_tool"));
    assert.ok(refused instanceof ToolCallError, String(refused));
    assert.match(refused.detail, /no_such_tool/);
    const failed = await rejection(episode.callTool("fail"));
    assert.ok(failed instanceof ToolFailedError, String(failed));
    assert.equal(failed.detail, "boom");

    let imageTaskId = "";
    const image = await episode.callTool("image", { size: 300 }, { onTaskId: (id) => (imageTaskId = id) });
    const block = onlyImage(image.blocks);
    assert.equal(block.mimeType, "image/png");
    assert.deepEqual(block.detail, { size: 300 });
    assert.deepEqual(block.data, imageBytes(300));
    assert.equal(image.reward, null);
    assert.match(imageTaskId, /\S/);
    assert.deepEqual(await episode.attach(imageTaskId), image, "attaching by task id gives the same output");

    const meta = await episode.callTool("metadata");
    assert.deepEqual(meta.blocks, [{ type: "text", text: "meta", detail: { b: 1, a: 1.0 } }]);
    assert.deepEqual((meta.metadata as { nested: unknown }).nested, { z: [1, 2.0], a: null });

    await episode.ping();
    const submitted = await episode.callTool("submit", { answer: "world" });
    assert.deepEqual([textOf(submitted.blocks), submitted.reward, submitted.finished], ["correct", 1, true]);

    await episode.close();
    await rejectsWith(episode.getPrompt(), ErrorReason.SESSION_NOT_FOUND);
    await episode.close(); // idempotent
  });

  test("a task given as a spec, with secrets, closed by `await using`", async () => {
    let sessionId = "";
    {
      await using episode = await env.createEpisode(
        { spec: { question: "Say hi", answer: "hi" } },
        { secrets: { TOKEN: "not-echoed" } },
      );
      sessionId = episode.sessionId;
      assert.equal(textOf(await episode.getPrompt()), "Say hi");
      assert.equal(textOf((await episode.callTool("secret")).blocks), "secret:['TOKEN']");
      assert.equal((await episode.callTool("submit", { answer: "hi" })).reward, 1);
    }
    // The generated service client is there for anything the API does not wrap; ORSError.from reads its errors.
    const gone = ORSError.from(await rejection(client.service.getPrompt({ sessionId })));
    assert.equal(gone.reason, ErrorReason.SESSION_NOT_FOUND);
  });

  test("task 0 of train has its own tool besides the shared ones", async () => {
    await using episode = await env.createEpisode({ split: "train", index: 0 });
    const tools = await episode.listTools();
    assert.equal(tools.at(-1)?.name, "hint");
    assert.equal(textOf((await episode.callTool("hint")).blocks), "the answer is hello");
  });
});

describe("the openreward surface on an environment without its features", () => {
  test("messages are the prompt as one user message; no terminal tool, no group scoring; refusals say why", async () => {
    await using episode = await env.createEpisode({ split: "train", index: 1 });
    assert.deepEqual(await episode.getMessages(), [textMessage("user", "Say world")]);
    const listing = await env.toolListing();
    assert.deepEqual([listing.terminalTool, listing.supportsScoreGroup], [null, false]);
    assert.ok(listing.messageBlockTypes.includes("text"), String(listing.messageBlockTypes));
    assert.equal(await episode.terminalTool(), null);
    assert.equal(await episode.isAssistantMessageFinal(), false);
    await assert.rejects(episode.callTerminalTool("world"), (error) => error instanceof ToolCallError && error.reason === "not_found");
    assert.equal(await episode.supportsScoreGroup(), false);
    await rejectsWith(episode.scoreGroup([[textMessage("assistant", "world")]]), ErrorReason.SCORE_GROUP_UNSUPPORTED);
    const unknown = await rejection(episode.callTool("no_such_tool"));
    assert.ok(unknown instanceof ToolCallError && unknown.reason === "not_found", String(unknown));
    const invalid = await rejection(episode.callTool("add", { a: "two" }));
    assert.ok(invalid instanceof ToolCallError && invalid.reason === "input_validation", String(invalid));
    await episode.callTool("submit", { answer: "world" });
    const finished = await rejection(episode.callTool("echo", { text: "late" }));
    assert.ok(finished instanceof ToolCallError && finished.reason === "episode_finished", String(finished));
  });
});

describe("episodes on one RunEpisode stream", () => {
  test("a failed step answers with its error and the stream goes on, episode after episode", async () => {
    const stream = client.openEpisodeStream();
    await rejectsWith(stream.createEpisode("nosuchenv", { split: "train", index: 0 }), ErrorReason.UNKNOWN_ENVIRONMENT);

    const first = await stream.createEpisode(ENV_NAME, { split: "train", index: 1 });
    assert.equal(textOf(await first.getPrompt()), "Say world");
    assert.ok((await first.listTools()).some((tool) => tool.name === "submit"));
    assert.equal(textOf((await first.callTool("add", { a: 40, b: 2 })).blocks), "42");
    await assert.rejects(first.callTool("no_such_tool"), ToolCallError);
    await assert.rejects(first.callTool("fail"), (error) => error instanceof ToolFailedError && error.detail === "boom");
    assert.deepEqual(onlyImage((await first.callTool("image", { size: 5 })).blocks).data, imageBytes(5));
    const submitted = await first.callTool("submit", { answer: "world" });
    assert.deepEqual([submitted.reward, submitted.finished], [1, true]);
    await first.close();
    await rejectsWith(first.attach("any-task"), ErrorReason.SESSION_NOT_FOUND);

    const second = await stream.createEpisode(ENV_NAME, { spec: { question: "Say yes", answer: "yes" } });
    assert.notEqual(second.sessionId, first.sessionId);
    assert.equal((await second.callTool("submit", { answer: "yes" })).reward, 1);
    await second.close();
    await stream.close();
    assert.equal(stream.failure, undefined);
  });

  test("steps made at once run one after another, in order", async () => {
    await using stream = client.openEpisodeStream();
    await using episode = await stream.createEpisode(ENV_NAME, { split: "test", index: 0 });
    const outputs = await Promise.all([1, 2, 3].map((a) => episode.callTool("add", { a, b: 10 })));
    assert.deepEqual(outputs.map((output) => textOf(output.blocks)), ["11", "12", "13"]);
  });
});
