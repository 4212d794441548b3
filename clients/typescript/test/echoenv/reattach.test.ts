// Tool calls whose stream broke are attached to again by task id (through a
// proxy that breaks connections), and a call can be attached to on purpose.
import assert from "node:assert/strict";
import net from "node:net";
import { after, before, describe, test } from "node:test";
import { Code, ErrorReason, ORSClient, ORSError, textOf, type ORSEpisode } from "../../src/index.js";
import { BreakingProxy } from "../breaking_proxy.js";
import { TARGET, clientOptions } from "../server.js";

const ENV_NAME = "echoenv";

const direct = new ORSClient(TARGET, clientOptions());
let proxy: BreakingProxy;
let proxied: ORSClient;

before(async () => {
  proxy = await BreakingProxy.start(TARGET);
  proxied = new ORSClient(proxy.target, clientOptions());
});
after(async () => {
  proxied.close();
  direct.close();
  await proxy.stop();
});

/** A loopback `host:port` nothing listens on (a port just freed). */
async function closedPort(): Promise<string> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return `127.0.0.1:${port}`;
}

/** Resolves once the server runs the call `taskId` of `episode` (it answers an attach with the task id). */
async function serverRuns(episode: ORSEpisode, taskId: string): Promise<void> {
  for (;;) {
    const probe = new AbortController();
    const events = direct.service.callTool(
      { sessionId: episode.sessionId, call: { taskId } },
      { headers: { "x-session-id": episode.sessionId }, signal: probe.signal },
    );
    try {
      for await (const { event } of events) {
        if (event.case === "taskId") return;
      }
    } catch (error) {
      if (ORSError.from(error).reason !== ErrorReason.UNKNOWN_TASK_ID) throw error;
    } finally {
      probe.abort();
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe("one RPC per step", () => {
  test("a CallTool stream broken after the task id is attached to again, and the output arrives", async () => {
    await using episode = await proxied.environment(ENV_NAME).createEpisode({ split: "train", index: 0 });
    const connectionsBefore = proxy.connections;
    const output = await episode.callTool("sleep", { seconds: 1 }, { onTaskId: () => proxy.cut() });
    assert.equal(textOf(output.blocks), "slept");
    assert.ok(proxy.connections > connectionsBefore, "the client connected again");
  });

  test("a caller that stopped waiting attaches to the call later by its task id", async () => {
    await using episode = await direct.environment(ENV_NAME).createEpisode({ split: "train", index: 0 });
    const stopWaiting = new AbortController();
    let taskId = "";
    const onTaskId = (id: string) => {
      taskId = id;
      stopWaiting.abort();
    };
    await assert.rejects(
      episode.callTool("sleep", { seconds: 0.5 }, { signal: stopWaiting.signal, onTaskId }),
      (error) => error instanceof ORSError && error.code === Code.Canceled,
    );
    assert.equal(textOf((await episode.attach(taskId)).blocks), "slept");
    await assert.rejects(
      episode.attach("no-such-task"),
      (error) => error instanceof ORSError && error.reason === ErrorReason.UNKNOWN_TASK_ID,
    );
  });
});

describe("RPCs that are safe to repeat", () => {
  test("are sent again when their connection broke, and creating an episode is not", async () => {
    await proxied.health(); // connected
    const before = proxy.connections;
    proxy.cutAndRefuse(1);
    assert.equal((await proxied.health()).status, "ok");
    assert.ok(proxy.connections >= before + 2, "a refused connection, then one that answered");

    proxy.cutAndRefuse(1);
    const refused = await proxied.environment(ENV_NAME).createEpisode({ split: "train", index: 0 }).catch((error: unknown) => error);
    proxy.cutAndRefuse(0);
    assert.ok(refused instanceof ORSError && refused.reason === ErrorReason.UNSPECIFIED, String(refused));
  });
});

describe("on a RunEpisode stream", () => {
  test("a stream broken while the tool runs: the call is attached to by its task id, later steps go by RPC", async () => {
    const stream = proxied.openEpisodeStream();
    const episode = await stream.createEpisode(ENV_NAME, { split: "train", index: 1 });
    const cutWhileRunning = (taskId: string) => void serverRuns(episode, taskId).then(() => proxy.cut());
    const output = await episode.callTool("sleep", { seconds: 1 }, { onTaskId: cutWhileRunning });
    assert.equal(textOf(output.blocks), "slept");
    assert.ok(stream.failure instanceof ORSError, "the stream broke");

    assert.equal(textOf(await episode.getPrompt()), "Say world");
    assert.equal((await episode.callTool("submit", { answer: "world" })).reward, 1);
    await episode.close();
    const gone = await direct.service.getPrompt({ sessionId: episode.sessionId }).catch(ORSError.from);
    assert.ok(gone instanceof ORSError && gone.reason === ErrorReason.SESSION_NOT_FOUND, String(gone));
    await stream.close();
  });

  test("a stream broken while idle: the next step goes by RPC", async () => {
    const stream = proxied.openEpisodeStream();
    const episode = await stream.createEpisode(ENV_NAME, { split: "train", index: 1 });
    proxy.cut();
    assert.equal(textOf(await episode.getPrompt()), "Say world");
    assert.ok(stream.failure instanceof ORSError, "the stream broke");
    await episode.close();
    await stream.close();
  });

  test("a stream that cannot connect rejects its first step and closes", async () => {
    const nowhere = new ORSClient(await closedPort(), clientOptions());
    try {
      const stream = nowhere.openEpisodeStream();
      await assert.rejects(
        stream.createEpisode(ENV_NAME, { split: "train", index: 0 }),
        (error) => error instanceof ORSError && error.code === Code.Unavailable,
      );
      await stream.close();
      await nowhere.openEpisodeStream().close(); // never used: nothing to fail
    } finally {
      nowhere.close();
    }
  });

  test("a caller that stopped waiting ends the stream; the call goes on, later steps go by RPC", async () => {
    await using stream = direct.openEpisodeStream();
    await using episode = await stream.createEpisode(ENV_NAME, { split: "train", index: 1 });
    const stopWaiting = new AbortController();
    let taskId = "";
    const onTaskId = (id: string) => {
      taskId = id;
      void serverRuns(episode, id).then(() => stopWaiting.abort());
    };
    const error = await episode.callTool("sleep", { seconds: 0.5 }, { signal: stopWaiting.signal, onTaskId }).catch((error: unknown) => error);
    assert.ok(error instanceof ORSError && error.code === Code.Canceled, String(error));
    assert.equal(stream.failure, error);
    assert.equal(textOf((await episode.attach(taskId)).blocks), "slept");
    assert.equal(textOf(await episode.getPrompt()), "Say world");
  });

  test("a stream broken before the call reached the server: the error says the tool did not run", async () => {
    const stream = proxied.openEpisodeStream();
    const episode = await stream.createEpisode(ENV_NAME, { split: "train", index: 1 });
    const dropped = proxy.dropNextSendAndCut();
    const error = await episode.callTool("echo", { text: "lost" }).catch((error: unknown) => error);
    await dropped;
    assert.ok(error instanceof ORSError, String(error));
    assert.equal(error.reason, ErrorReason.UNKNOWN_TASK_ID);
    assert.match(error.detail, /did not run/);
    await episode.close();
  });
});
