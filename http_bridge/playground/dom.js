// Building DOM nodes. Text goes in as text nodes and attributes through
// setAttribute, never as HTML: whatever an environment returns is untrusted.

/**
 * `el("div", {class: "x", dataset: {tool: "t"}, onclick: f}, child, "text", ...)`.
 * Strings become text nodes; null and undefined children are skipped.
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node) {
  node.replaceChildren();
  return node;
}

export function byId(id) {
  return document.getElementById(id);
}

/** JSON as readable text (for a `<pre>`). */
export function pretty(value) {
  return JSON.stringify(value, null, 2);
}
