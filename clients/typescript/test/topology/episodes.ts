// Episodes of the example environment `arithmetic` for the load-balancer
// checks (deploy/envoy/run_topology.py --check): EPISODES episodes against
// ORS_TARGET, CONCURRENCY at a time, odd ones by one RPC per step, even ones
// on RunEpisode streams. Each runs prompt, calculator, submit and must be
// rewarded 1. Prints one JSON line: {"episodes", "lost", "errors"}.
import { ORSClient, textOf, type Environment, type ORSEpisode } from "../../src/index.js";

const target = process.env.ORS_TARGET ?? "127.0.0.1:50051";
const count = Number(process.env.EPISODES ?? "100");
const concurrency = Number(process.env.CONCURRENCY ?? "10");
const MAX_ERRORS_SHOWN = 5;

async function play(episode: ORSEpisode, answer: number): Promise<void> {
  if ((await episode.getPrompt()).length === 0) throw new Error("empty prompt");
  const sum = await episode.callTool("calculator", { a: answer, b: 0, op: "+" });
  if (textOf(sum.blocks) !== String(answer)) throw new Error(`calculator said ${textOf(sum.blocks)}`);
  const done = await episode.callTool("submit", { answer });
  if (done.reward !== 1 || !done.finished) throw new Error(`submit: reward ${done.reward}, finished ${done.finished}`);
}

async function runEpisode(client: ORSClient, env: Environment, index: number, answers: number[]): Promise<void> {
  const task = { split: "train", index: index % answers.length };
  if (index % 2 === 1) {
    await using episode = await env.createEpisode(task);
    await play(episode, answers[task.index]);
  } else {
    await using stream = client.openEpisodeStream();
    await using episode = await stream.createEpisode(env.name, task);
    await play(episode, answers[task.index]);
  }
}

const client = new ORSClient(target);
const env = client.environment("arithmetic");
const answers = (await env.listTasks("train")).map((spec) => Number(spec.answer));
const errors: string[] = [];
let next = 0;
async function worker(): Promise<void> {
  while (next < count) {
    const index = next++;
    try {
      await runEpisode(client, env, index, answers);
    } catch (error) {
      errors.push(`episode ${index}: ${String(error)}`);
    }
  }
}
await Promise.all(Array.from({ length: concurrency }, worker));
client.close();
console.log(JSON.stringify({ episodes: count, lost: errors.length, errors: errors.slice(0, MAX_ERRORS_SHOWN) }));
