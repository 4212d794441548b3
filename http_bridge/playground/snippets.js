// "Copy as": the last tool call as a curl command, and as the same episode
// written for each client (ors.client, openreward, ors_grpc.client,
// TypeScript). Secrets and the API key are never written into a snippet:
// they are read from environment variables named after them.

import { API_KEY_HEADER, SESSION_ID_HEADER } from "./constants.js";

/** A JSON value as a Python literal. */
export function python(value) {
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "string" || typeof value === "number") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(python).join(", ")}]`;
  return `{${Object.entries(value).map(([key, item]) => `${JSON.stringify(key)}: ${python(item)}`).join(", ")}}`;
}

/** A string as one shell word. */
export function shell(text) {
  return `'${String(text).replaceAll("'", "'\\''")}'`;
}

function pythonSecrets(names) {
  return `{${names.map((name) => `${JSON.stringify(name)}: os.environ[${JSON.stringify(name)}]`).join(", ")}}`;
}

function curl({ origin, env, sessionId, call, usesKey }) {
  const key = usesKey ? ` -H "${API_KEY_HEADER}: $ORS_API_KEY"` : "";
  return [
    `curl -sN -X POST ${shell(`${origin}/${env}/call`)}${key} \\`,
    `  -H ${shell(`${SESSION_ID_HEADER}: ${sessionId}`)} -H 'Content-Type: application/json' \\`,
    `  -d ${shell(JSON.stringify({ name: call.name, input: call.input }))}`,
  ].join("\n");
}

/** `split=..., index=...` or the task spec, as Python arguments of `session(...)`. */
function pythonTask(task, spec) {
  return task.spec ? spec(python(task.spec)) : `split=${python(task.split)}, index=${task.index}`;
}

function pythonHeader(usesKey, secretNames) {
  return usesKey || secretNames.length ? "import os\n\n" : "";
}

function orsClient({ origin, env, task, call, usesKey, secretNames }) {
  const options = [
    pythonTask(task, (spec) => `Task(environment_name=${python(env)}, task_spec=${spec})`),
    secretNames.length ? `secrets=${pythonSecrets(secretNames)}` : null,
  ].filter(Boolean).join(", ");
  return `${pythonHeader(usesKey, secretNames)}from ors.client import ORS${task.spec ? ", Task" : ""}

with ORS(base_url=${python(origin)}${usesKey ? ', api_key=os.environ["ORS_API_KEY"]' : ""}) as client:
    env = client.environment(${python(env)})
    with env.session(${options}) as session:
        result = session.call_tool(${python(call.name)}, ${python(call.input)})
        print(result.blocks, result.reward, result.finished)
`;
}

function openreward({ origin, env, task, call, usesKey, secretNames, toolset }) {
  const options = [
    pythonTask(task, (spec) => `Task(server_name="", environment_name=${python(env)}, task_spec=${spec}, namespace=None)`),
    secretNames.length ? `secrets=${pythonSecrets(secretNames)}` : null,
    toolset ? `toolset=${python(toolset)}` : null,
  ].filter(Boolean).join(", ");
  const imports = task.spec
    ? "from openreward import EnvironmentsAPI\nfrom openreward.api.environments.types import Task"
    : "from openreward import EnvironmentsAPI";
  return `import os

${imports}

api = EnvironmentsAPI(base_url=${python(origin)}, api_key=os.environ.get("ORS_API_KEY", ""))
env = api.get(${python(env)})
with env.session(${options}) as session:
    result = session.call_tool(${python(call.name)}, ${python(call.input)})
    print(result.blocks, result.reward, result.finished)
`;
}

function orsGrpcClient({ env, task, call, usesKey, secretNames, toolset }) {
  const options = [
    task.spec ? python(task.spec) : `split=${python(task.split)}, index=${task.index}`,
    secretNames.length ? `secrets=${pythonSecrets(secretNames)}` : null,
    toolset ? `toolset=${python(toolset)}` : null,
  ].filter(Boolean).join(", ");
  return `${pythonHeader(usesKey, secretNames)}from ors_grpc.client import ORSClient

# The server's gRPC port (\`ors-grpc serve --port\`), not its HTTP one.
with ORSClient("127.0.0.1:50051"${usesKey ? ', api_key=os.environ["ORS_API_KEY"]' : ""}) as client:
    env = client.environment(${python(env)})
    with env.session(${options}) as session:
        result = session.call_tool(${python(call.name)}, ${python(call.input)})
        print(result.blocks, result.reward, result.finished)
`;
}

function typescript({ env, task, call, usesKey, secretNames, toolset }) {
  const source = task.spec ? `{ spec: ${JSON.stringify(task.spec)} }` : `{ split: ${JSON.stringify(task.split)}, index: ${task.index} }`;
  const options = [
    secretNames.length ? `secrets: { ${secretNames.map((name) => `${JSON.stringify(name)}: process.env[${JSON.stringify(name)}]!`).join(", ")} }` : null,
    toolset ? `toolset: ${JSON.stringify(toolset)}` : null,
  ].filter(Boolean);
  return `import { ORSClient } from "ors-grpc-typescript-client";

// The server's gRPC port (\`ors-grpc serve --port\`), not its HTTP one.
const client = new ORSClient("127.0.0.1:50051"${usesKey ? ", { apiKey: process.env.ORS_API_KEY }" : ""});
{
  await using episode = await client.environment(${JSON.stringify(env)}).createEpisode(${source}${options.length ? `, { ${options.join(", ")} }` : ""});
  const result = await episode.callTool(${JSON.stringify(call.name)}, ${JSON.stringify(call.input)});
  console.log(result.blocks, result.reward, result.finished);
}
client.close();
`;
}

/** The snippet makers, by the label the page shows. */
export const SNIPPETS = {
  curl,
  "Python (ors.client)": orsClient,
  "Python (openreward)": openreward,
  "Python (ors_grpc.client)": orsGrpcClient,
  TypeScript: typescript,
};
