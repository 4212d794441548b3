// An episode of the example environment `arithmetic`, with the typed client.
// Run from clients/typescript after `npm ci`: node dist/examples/quickstart.js
import { ORSClient, ToolCallError } from "../src/index.js";

const client = new ORSClient(process.env.ORS_TARGET ?? "127.0.0.1:50051", { apiKey: process.env.ORS_API_KEY });
const env = client.environment("arithmetic");
console.log(await env.listSplits()); // [ { name: 'train', type: 'train' }, { name: 'test', type: 'test' } ]

{
  await using episode = await env.createEpisode({ split: "train", index: 0 }); // closed at the end of the block
  const [prompt] = await episode.getPrompt();
  console.log(prompt.type === "text" ? prompt.text : prompt.mimeType); // What is 12 + 30? ...
  const sum = await episode.callTool("calculator", { a: 12, b: 30, op: "+" });
  console.log(sum.blocks[0].type === "text" && sum.blocks[0].text); // 42
  try {
    await episode.callTool("no_such_tool", {});
  } catch (error) {
    if (!(error instanceof ToolCallError)) throw error;
    console.log("refused:", error.detail); // a tool-level error: the server did not run it
  }
  const done = await episode.callTool("submit", { answer: 42 });
  console.log(done.reward, done.finished); // 1 true
}

// The same over one RunEpisode stream (a few times cheaper for short episodes).
{
  await using stream = client.openEpisodeStream();
  await using episode = await stream.createEpisode("arithmetic", { split: "test", index: 0 });
  const done = await episode.callTool("submit", { answer: 9801 });
  console.log(done.reward, done.finished); // 1 true
}
client.close();
