// Content blocks and messages as the ORS HTTP API returns them, rendered as
// DOM nodes: text as text, images as images, reasoning / tool-call /
// tool-result blocks told apart.

import { el, pretty } from "./dom.js";

/** Image types shown inline; anything else is named, not shown. */
const IMAGE_TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

function detail(block) {
  if (block.detail === null || block.detail === undefined) return null;
  return el("details", { class: "detail" }, el("summary", {}, "detail"), el("pre", {}, pretty(block.detail)));
}

function image(block) {
  const mime = String(block.mimeType ?? "");
  const data = String(block.data ?? "");
  if (!IMAGE_TYPES.has(mime) || !BASE64.test(data)) {
    return el("div", { class: "block block-image unshown" }, `an image of type ${mime || "unknown"} (not shown)`);
  }
  return el(
    "figure", { class: "block block-image" },
    el("img", { src: `data:${mime};base64,${data}`, alt: `image (${mime})` }),
    detail(block),
  );
}

function text(block, kind = "text") {
  return el("div", { class: `block block-${kind}` }, el("pre", { class: "text" }, String(block.text ?? "")), detail(block));
}

function toolCall(block) {
  return el(
    "div", { class: "block block-tool_call" },
    el("div", { class: "label" }, "tool call ", el("code", {}, String(block.name ?? "")), ` (${block.id ?? ""})`),
    el("pre", {}, pretty(block.input)),
    detail(block),
  );
}

function toolResult(block) {
  return el(
    "div", { class: `block block-tool_result${block.is_error ? " is-error" : ""}` },
    el("div", { class: "label" }, `tool result for ${block.tool_call_id ?? ""}${block.is_error ? " (error)" : ""}`),
    (block.blocks ?? []).map((inner) => renderBlock(inner)),
    detail(block),
  );
}

/** One block of any kind (text, image, reasoning, tool_call, tool_result). */
export function renderBlock(block) {
  switch (block?.type) {
    case "image": return image(block);
    case "reasoning": return text(block, "reasoning");
    case "tool_call": return toolCall(block);
    case "tool_result": return toolResult(block);
    case "text": return text(block);
    default: return el("pre", { class: "block block-unknown" }, pretty(block));
  }
}

export function renderBlocks(blocks) {
  return el("div", { class: "blocks" }, (blocks ?? []).map(renderBlock));
}

/** `[Message]` from `/{env}/messages`: one box per message, its role named. */
export function renderMessages(messages) {
  return el(
    "div", { class: "messages" },
    messages.map((message) =>
      el(
        "div", { class: `message role-${String(message.role).replace(/[^a-z]/g, "")}` },
        el("div", { class: "role" }, String(message.role)),
        (message.blocks ?? []).map(renderBlock),
      ),
    ),
  );
}
