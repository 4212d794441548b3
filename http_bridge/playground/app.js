// The playground: pick an environment and a task, play an episode by hand
// through the standard ORS HTTP API, and watch the server's live counters.

import { ApiError, getJson, postJson, postTask, setApiKey } from "./api.js";
import { renderBlocks, renderMessages } from "./blocks.js";
import { append, byId, clear, el, pretty } from "./dom.js";
import { startLiveView } from "./live.js";
import { FormError, toolForm } from "./schema_form.js";
import { SNIPPETS } from "./snippets.js";

const PING_MS = 30000;

/** The open episode, or null. Only in memory. */
let episode = null;
let lastCall = null;
let keyInUse = false;

/** A reward as the wire has it: 1.0 stays 1.0 (JSON numbers lose the point in JavaScript). */
function reward(value) {
  if (value === null || value === undefined) return "none";
  return Number.isInteger(value) ? value.toFixed(1) : String(value);
}

function say(message, kind = "info") {
  const status = byId("status");
  status.textContent = message;
  status.dataset.kind = kind;
}

function describe(error) {
  if (error instanceof ApiError) return `${error.status}: ${error.detail}`;
  return error.message;
}

/** Runs `action`; a failure is shown in the status line instead of thrown. */
async function guarded(action) {
  try {
    return await action();
  } catch (error) {
    say(describe(error), "error");
    return undefined;
  }
}

// --- the API key ---------------------------------------------------------------

async function connect() {
  try {
    const environments = await getJson("/list_environments");
    byId("auth").hidden = true;
    fillEnvironments(environments);
    startLiveView();
    say(`Connected: ${environments.length} environment(s).`);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      byId("auth").hidden = false;
      placeholder(byId("env"), "needs an API key");
      say(keyInUse ? "That API key was refused." : "This server needs an API key.", keyInUse ? "error" : "info");
      byId("api-key").focus();
      return;
    }
    say(describe(error), "error");
  }
}

function useKey(event) {
  event.preventDefault();
  const input = byId("api-key");
  setApiKey(input.value);
  keyInUse = input.value !== "";
  input.value = "";
  connect();
}

// --- choosing the task -----------------------------------------------------------

function selectedEnv() {
  return byId("env").value;
}

/** A select that shows why it has no choices yet (loading, a key needed), and cannot be used meanwhile. */
function placeholder(select, text) {
  clear(select).append(el("option", { value: "" }, text));
  select.disabled = true;
}

/** The task form: usable once its environment's splits are in, busy (and saying so) before. */
function setReady(ready) {
  byId("setup").setAttribute("aria-busy", String(!ready));
  byId("start").disabled = !ready;
}

function fillEnvironments(names) {
  const select = clear(byId("env"));
  for (const name of names) select.append(el("option", { value: name }, name));
  select.disabled = names.length === 0;
  if (names.length) loadEnvironment();
  else placeholder(select, "no environments");
}

async function loadEnvironment() {
  const env = selectedEnv();
  setReady(false);
  placeholder(byId("split"), "loading splits…");
  byId("task-json").textContent = "loading the task…";
  const loaded = await guarded(async () => {
    const splits = await getJson(`/${encodeURIComponent(env)}/splits`);
    const select = clear(byId("split"));
    for (const split of splits) select.append(el("option", { value: split.name }, `${split.name} (${split.type})`));
    select.disabled = false;
    setReady(true);
    await showTask();
    return true;
  });
  if (!loaded) {
    placeholder(byId("split"), "no splits (see the error above)");
    byId("task-json").textContent = "";
  }
}

async function showTask() {
  const env = selectedEnv();
  const split = byId("split").value;
  const index = Number(byId("index").value);
  const view = byId("task-json");
  try {
    const { num_tasks: count } = await postJson(`/${encodeURIComponent(env)}/num_tasks`, { split });
    byId("index").max = String(Math.max(count - 1, 0));
    byId("task-count").textContent = `of ${count}`;
    const { task } = await postJson(`/${encodeURIComponent(env)}/task`, { split, index });
    view.textContent = pretty(task);
  } catch (error) {
    view.textContent = describe(error);
  }
}

function taskSource() {
  if (byId("source-spec").checked) {
    let spec;
    try {
      spec = JSON.parse(byId("task-spec").value);
    } catch (error) {
      throw new FormError(`task spec: not JSON (${error.message})`);
    }
    if (spec === null || typeof spec !== "object" || Array.isArray(spec)) throw new FormError("task spec: a JSON object");
    return { spec };
  }
  return { split: byId("split").value, index: Number(byId("index").value) };
}

function secrets() {
  const text = byId("secrets").value.trim();
  if (!text) return {};
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new FormError(`secrets: not JSON (${error.message})`);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)
      || !Object.values(value).every((item) => typeof item === "string")) {
    throw new FormError('secrets: an object of strings, {"NAME": "value"}');
  }
  return value;
}

// --- the episode -------------------------------------------------------------------

async function startEpisode(event) {
  event.preventDefault();
  if (episode) await endEpisode();
  await guarded(async () => {
    const env = selectedEnv();
    const task = taskSource();
    const secretValues = secrets();
    const toolset = byId("toolset").value.trim();
    const { sid } = await postJson("/create_session", {});
    const body = { env_name: env, secrets: secretValues };
    if (task.spec) body.task_spec = task.spec;
    else Object.assign(body, { split: task.split, index: task.index });
    if (toolset) body.toolset_name = toolset;
    await postJson("/create", body, { sessionId: sid });
    episode = {
      env, sid, task, toolset, secretNames: Object.keys(secretValues), total: 0, finished: false,
      ping: setInterval(() => postJson("/ping", {}, { sessionId: sid }).catch(() => {}), PING_MS),
    };
    byId("secrets").value = ""; // kept by the server for the episode, not by the page
    lastCall = null;
    showEpisode();
    say(`Episode started (session ${sid}); waiting for setup.`);
    const base = `/${encodeURIComponent(env)}`;
    const [messages, listing] = await Promise.all([
      getJson(`${base}/messages`, { sessionId: sid }),
      getJson(`${base}/task_tools`, { sessionId: sid }),
    ]);
    clear(byId("prompt")).append(renderMessages(messages));
    showTools(listing);
    say(`Episode ready (session ${sid}).`);
  });
}

function showEpisode() {
  byId("episode").hidden = false;
  byId("session-id").textContent = episode.sid;
  clear(byId("prompt"));
  clear(byId("tools"));
  clear(byId("transcript"));
  byId("scoring").hidden = true;
  byId("copy-as").hidden = true;
  showScore();
}

function showScore() {
  byId("total-reward").textContent = reward(episode.total);
  const state = byId("episode-state");
  state.textContent = episode.finished ? "finished" : "running";
  state.dataset.state = episode.finished ? "finished" : "running";
}

function showTools(listing) {
  const box = clear(byId("tools"));
  for (const tool of listing.tools) box.append(toolCard(tool.name, tool.description, tool.input_schema, false));
  const terminal = listing.terminal_tool;
  if (terminal) {
    const schema = terminal.arg
      ? { type: "object", properties: { [terminal.arg]: { type: "string" } }, required: [terminal.arg] }
      : { type: "object", properties: {} };
    box.append(toolCard(terminal.name, terminal.description, schema, true));
  }
  byId("scoring").hidden = !listing.supports_score_group;
}

function toolCard(name, description, schema, terminal) {
  const form = toolForm(schema);
  const card = el(
    "form", { class: `tool${terminal ? " terminal" : ""}`, dataset: { tool: name } },
    el("h3", {}, el("code", {}, String(name)), terminal ? el("span", { class: "badge" }, "terminal") : null),
    description ? el("p", { class: "description" }, String(description)) : null,
    form.node,
    el("button", { type: "submit", class: "call" }, "Call"),
  );
  card.addEventListener("submit", (event) => {
    event.preventDefault();
    let input;
    try {
      input = form.read();
    } catch (error) {
      say(error.message, "error");
      return;
    }
    callTool(name, input);
  });
  return card;
}

function transcriptEntry(title, input) {
  const entry = el(
    "li", { class: "call-entry", dataset: { state: "running" } },
    el("div", { class: "call-head" },
      el("code", { class: "call-name" }, title), " ", el("span", { class: "task-id" }, "waiting for the task id")),
    el("pre", { class: "call-input" }, pretty(input)),
    el("div", { class: "call-result" }, "running…"),
  );
  byId("transcript").prepend(entry);
  return entry;
}

function settle(entry, state, ...content) {
  entry.dataset.state = state;
  append(clear(entry.querySelector(".call-result")), content);
}

async function callTool(name, input) {
  if (!episode) return;
  const { env, sid } = episode;
  lastCall = { name, input };
  showCopyAs();
  const entry = transcriptEntry(name, input);
  try {
    const result = await postTask(`/${encodeURIComponent(env)}/call`, { name, input }, {
      sessionId: sid,
      onTaskId: (taskId) => { entry.querySelector(".task-id").textContent = `task ${taskId}`; },
    });
    if (!result.ok) {
      const reason = result.reason ? ` (${result.reason})` : "";
      settle(entry, "refused", el("div", { class: "refusal" }, `refused${reason}: ${result.error}`));
      return;
    }
    const { output } = result;
    if (typeof output.reward === "number" && episode?.sid === sid) episode.total += output.reward;
    if (output.finished && episode?.sid === sid) episode.finished = true;
    settle(
      entry, "ok", renderBlocks(output.blocks),
      el("div", { class: "outcome" },
        el("span", { class: "reward" }, `reward ${reward(output.reward)}`),
        output.finished ? el("span", { class: "badge finished" }, "finished") : null),
      output.metadata !== null ? el("details", {}, el("summary", {}, "metadata"), el("pre", {}, pretty(output.metadata))) : null,
    );
    if (episode?.sid === sid) showScore();
  } catch (error) {
    settle(entry, "failed", el("div", { class: "failure" }, `failed: ${describe(error)}`));
  }
}

async function scoreGroup(event) {
  event.preventDefault();
  if (!episode) return;
  const { env, sid } = episode;
  let candidates;
  try {
    candidates = JSON.parse(byId("candidates").value);
    if (!Array.isArray(candidates)) throw new FormError("a JSON array of candidates");
  } catch (error) {
    say(`candidates: ${error.message}`, "error");
    return;
  }
  const entry = transcriptEntry("score_group", candidates);
  try {
    const result = await postTask(`/${encodeURIComponent(env)}/score_group`, { candidates }, {
      sessionId: sid,
      onTaskId: (taskId) => { entry.querySelector(".task-id").textContent = `task ${taskId}`; },
    });
    settle(entry, "ok", el("ol", { class: "scores" }, result.scores.map((score) =>
      el("li", {}, `reward ${reward(score.reward)}`, score.metadata !== null ? el("pre", {}, pretty(score.metadata)) : null))));
  } catch (error) {
    settle(entry, "failed", el("div", { class: "failure" }, `failed: ${describe(error)}`));
  }
}

async function endEpisode() {
  if (!episode) return;
  const { sid, ping } = episode;
  clearInterval(ping);
  episode = null;
  byId("episode").hidden = true;
  await guarded(async () => {
    await postJson("/delete", {}, { sessionId: sid });
    await postJson("/delete_session", {}, { sessionId: sid });
    say(`Episode ended (session ${sid}).`);
  });
}

// --- copy as -------------------------------------------------------------------------

function showCopyAs() {
  byId("copy-as").hidden = false;
  renderSnippet();
}

function renderSnippet() {
  if (!lastCall || !episode) return;
  const make = SNIPPETS[byId("snippet-kind").value];
  byId("snippet").textContent = make({
    origin: window.location.origin, env: episode.env, sessionId: episode.sid, task: episode.task,
    toolset: episode.toolset, secretNames: episode.secretNames, call: lastCall, usesKey: keyInUse,
  });
}

async function copySnippet() {
  const text = byId("snippet").textContent;
  try {
    await navigator.clipboard.writeText(text);
    say("Copied.");
  } catch {
    window.getSelection().selectAllChildren(byId("snippet"));
    say("Selected: copy it with your keyboard.");
  }
}

// --- wiring ----------------------------------------------------------------------------

function init() {
  const kinds = byId("snippet-kind");
  for (const label of Object.keys(SNIPPETS)) kinds.append(el("option", { value: label }, label));
  byId("auth").addEventListener("submit", useKey);
  byId("env").addEventListener("change", loadEnvironment);
  byId("split").addEventListener("change", showTask);
  byId("index").addEventListener("change", showTask);
  byId("setup").addEventListener("submit", startEpisode);
  byId("end-episode").addEventListener("click", endEpisode);
  byId("scoring").addEventListener("submit", scoreGroup);
  kinds.addEventListener("change", renderSnippet);
  byId("copy").addEventListener("click", copySnippet);
  connect();
}

init();
