// The live view: the server's own counters (`GET /server_stats`), per
// environment, refreshed every few seconds.

import { ApiError, getJson } from "./api.js";
import { byId, clear, el } from "./dom.js";

export const REFRESH_MS = 3000;

function milliseconds(value) {
  return value === null || value === undefined ? "–" : `${Number(value).toFixed(1)} ms`;
}

function errorList(errors) {
  if (!errors.length) return "none";
  return el("ul", { class: "errors" }, errors.map((error) =>
    el("li", {},
      el("time", {}, new Date(error.time_unix_ms).toLocaleTimeString()), " ",
      el("code", {}, String(error.source)), " ", String(error.message))));
}

function row(stats) {
  return el(
    "tr", { dataset: { environment: stats.env_name } },
    el("th", { scope: "row" }, String(stats.env_name)),
    el("td", { class: "open-sessions" }, String(stats.open_sessions)),
    el("td", { class: "prepared-episodes" }, String(stats.prepared_episodes)),
    el("td", { class: "calls-per-second" }, Number(stats.tool_calls_per_second).toFixed(2)),
    el("td", { class: "latency-p50" }, milliseconds(stats.call_latency_p50_ms)),
    el("td", { class: "latency-p99" }, milliseconds(stats.call_latency_p99_ms)),
    el("td", { class: "recent-errors" }, errorList(stats.recent_errors ?? [])),
  );
}

async function refresh() {
  const body = byId("live-rows");
  const note = byId("live-note");
  try {
    const stats = await getJson("/server_stats");
    clear(body).append(...stats.environments.map(row));
    note.textContent = `over the last ${stats.window_seconds} s; updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    note.textContent = error instanceof ApiError ? `not available: ${error.detail}` : `not available: ${error.message}`;
  }
}

let timer = null;

/** Refresh now and every REFRESH_MS (again from now, if already running). */
export function startLiveView() {
  clearInterval(timer);
  refresh();
  timer = setInterval(refresh, REFRESH_MS);
}

export { refresh as refreshLiveView };
