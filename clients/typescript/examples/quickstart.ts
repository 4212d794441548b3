// Episodes of the example environment `arithmetic` with the typed client: one
// RPC per step, then on a RunEpisode stream. In clients/typescript, after
// `npm ci` (which compiles it): node dist/examples/quickstart.js
import { ORSClient, ToolCallError, textOf } from "../src/index.js";

// Options: { apiKey: "KEY" } for `--api-key KEY`; { tls: { ca: readFileSync("cert.pem") } } for TLS.
const client = new ORSClient(process.env.ORS_TARGET ?? "127.0.0.1:50051");
const env = client.environment("arithmetic");
console.log(await env.listSplits()); // [ { name: 'train', type: 'train' }, { name: 'test', type: 'test' } ]

{
  await using episode = await env.createEpisode({ split: "train", index: 0 }); // closed when the block ends
  console.log(textOf(await episode.getPrompt())); // What is 12 + 30? Use the calculator, then submit the answer.
  const sum = await episode.callTool("calculator", { a: 12, b: 30, op: "+" });
  console.log(textOf(sum.blocks)); // 42
  try {
    await episode.callTool("no_such_tool", {});
  } catch (error) {
    if (!(error instanceof ToolCallError)) throw error; // ToolFailedError: the tool raised; ORSError: the RPC failed
    console.log("refused:", error.detail); // refused: 'no_such_tool' is not a valid tool
  }
  const done = await episode.callTool("submit", { answer: 42 });
  console.log(done.reward, done.finished); // 1 true
}

{
  await using stream = client.openEpisodeStream(); // one stream, episode after episode
  await using episode = await stream.createEpisode("arithmetic", { split: "test", index: 0 });
  const done = await episode.callTool("submit", { answer: 9801 });
  console.log(done.reward, done.finished); // 1 true
}
client.close();
