// The openreward surface against `openrewardenv` (tests/support/openreward_dialect_env.py),
// served with its GraderToolset registered (`--toolset`): messages, the
// terminal tool, toolsets attached by name, group scoring, refusal reasons,
// one RPC per step and on a RunEpisode stream.
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import {
  ErrorReason,
  ORSClient,
  ORSError,
  ScoreGroupFailedError,
  ToolCallError,
  textMessage,
  textOf,
  type Message,
  type ORSEpisode,
} from "../../src/index.js";
import { TARGET, clientOptions } from "../server.js";

const ENV_NAME = "openrewardenv";
const client = new ORSClient(TARGET, clientOptions());
const env = client.environment(ENV_NAME);
after(() => client.close());

/** The transcript OpenRewardEnv.get_messages makes for a question. */
function expectedMessages(question: string): Message[] {
  return [
    { role: "system", blocks: [{ type: "text", text: "Answer briefly.", detail: null }], detail: null },
    { role: "user", blocks: [{ type: "text", text: question, detail: null }], detail: { turn: 1 } },
    {
      role: "assistant",
      blocks: [
        { type: "reasoning", text: "Let me look it up.", signature: "sig-1", detail: null },
        { type: "tool_call", id: "call-1", name: "lookup", input: { tag: "q", n: 2 ** 70 }, detail: null },
      ],
      detail: null,
    },
    {
      role: "user",
      blocks: [
        { type: "tool_result", toolCallId: "call-1", blocks: [{ type: "text", text: "found q", detail: null }], isError: false, detail: null },
        { type: "text", text: "Now answer.", detail: null },
      ],
      detail: null,
    },
  ];
}

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => assert.fail("expected a rejection"),
    (error: unknown) => error,
  );
}

/** Messages, terminal tool, scoring and refusals: the same checks on either kind of episode. */
async function checkEpisode(episode: ORSEpisode): Promise<void> {
  const transcript = await episode.getMessages();
  assert.deepEqual(transcript, expectedMessages("What is 2+2?"));
  assert.match(textOf(await episode.getPrompt()), /What is 2\+2\?/);

  const tools = (await episode.listTools()).map((tool) => tool.name);
  for (const name of ["wait_read", "wait_step", "lookup", "clash"]) assert.ok(tools.includes(name), `missing ${name} in ${tools}`);
  assert.ok(!tools.includes("submit"), "the terminal tool is not among the tools");
  assert.deepEqual(await episode.terminalTool(), { name: "submit", arg: "answer", description: "Submit the final answer." });
  assert.equal(await episode.isAssistantMessageFinal(), true);
  assert.equal(await episode.supportsScoreGroup(), true);

  let scoringId = "";
  const scores = await episode.scoreGroup(
    [
      [...transcript, textMessage("assistant", "4")],
      { messages: [...transcript, textMessage("assistant", "5")], metadata: { rollout: 2 } },
    ],
    { onTaskId: (id) => (scoringId = id) },
  );
  assert.deepEqual(scores, [
    { reward: 1, metadata: null },
    { reward: 0, metadata: { rollout: 2 } },
  ]);
  assert.match(scoringId, /\S/);
  assert.deepEqual(await episode.attachScoreGroup(scoringId), scores, "attaching to the scoring by task id gives its scores");
  const failed = await rejection(episode.scoreGroup([{ messages: transcript, metadata: { fail: true } }]));
  assert.ok(failed instanceof ScoreGroupFailedError && failed.detail.includes("judge unavailable"), String(failed));
  const miscounted = await rejection(episode.scoreGroup([{ messages: transcript, metadata: { drop: true } }]));
  assert.ok(miscounted instanceof ScoreGroupFailedError, String(miscounted));

  const collision = await rejection(episode.callTool("clash"));
  assert.ok(collision instanceof ToolCallError && collision.reason === "name_collision", String(collision));
  assert.equal(textOf((await episode.callTool("lookup", { tag: "x" })).blocks), "found x");

  const graded = await episode.callTerminalTool("4");
  assert.deepEqual([textOf(graded.blocks), graded.reward, graded.finished], ["correct", 1, true]);
  const late = await rejection(episode.callTool("lookup", { tag: "y" }));
  assert.ok(late instanceof ToolCallError && late.reason === "episode_finished", String(late));
  assert.equal((await episode.scoreGroup([[textMessage("assistant", "4")]]))[0].reward, 1, "scoring goes on after the episode finished");
}

describe("an environment in the openreward dialect", () => {
  test("its listing names the terminal tool, group scoring and the block types messages may hold", async () => {
    const listing = await env.toolListing();
    assert.deepEqual(listing.terminalTool, { name: "submit", arg: "answer", description: "Submit the final answer." });
    assert.equal(listing.supportsScoreGroup, true);
    for (const type of ["text", "image", "reasoning", "tool_call", "tool_result"]) {
      assert.ok(listing.messageBlockTypes.includes(type), `missing ${type}`);
    }
    assert.ok(!listing.tools.some((tool) => tool.name === "submit"));
  });

  test("an episode with one RPC per step", async () => {
    await using episode = await env.createEpisode({ split: "train", index: 0 });
    await checkEpisode(episode);
  });

  test("an episode on a RunEpisode stream", async () => {
    await using stream = client.openEpisodeStream();
    await using episode = await stream.createEpisode(ENV_NAME, { split: "train", index: 0 });
    await checkEpisode(episode);
  });

  test("a toolset attached by name: its tools join, its terminal tool wins", async () => {
    await using stream = client.openEpisodeStream();
    for (const episode of [
      await env.createEpisode({ split: "train", index: 1 }, { toolset: "GraderToolset" }),
      await stream.createEpisode(ENV_NAME, { split: "train", index: 1 }, { toolset: "GraderToolset" }),
    ]) {
      assert.ok((await episode.listTools()).some((tool) => tool.name === "toolset_echo"));
      assert.equal(textOf((await episode.callTool("toolset_echo", { answer: "hi" })).blocks), "toolset hi");
      assert.deepEqual(await episode.terminalTool(), { name: "grade", arg: null, description: "Grade from the environment's state." });
      const graded = await episode.callTerminalTool();
      assert.deepEqual([textOf(graded.blocks), graded.reward, graded.finished], ["graded", 0.5, true]);
      await episode.close();
    }
  });

  test("an unknown toolset is refused with its reason", async () => {
    const error = await rejection(env.createEpisode({ split: "train", index: 0 }, { toolset: "NoSuchToolset" }));
    assert.ok(error instanceof ORSError && error.reason === ErrorReason.UNKNOWN_TOOLSET, String(error));
    assert.match(error.detail, /GraderToolset/);
  });
});
