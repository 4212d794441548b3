// A form generated from a tool's JSON Schema (what pydantic writes): strings,
// numbers, integers, booleans, enums, arrays, nested objects, `$ref`s to
// `$defs`, and optional (`anyOf` with null) fields. Any other schema gets a
// raw-JSON editor, and every form can switch to one.

import { el, pretty } from "./dom.js";

/** A value the form cannot turn into the tool's input (shown to the user). */
export class FormError extends Error {}

function resolve(schema, root, seen = new Set()) {
  if (schema && typeof schema.$ref === "string" && !seen.has(schema.$ref)) {
    const match = /^#\/(\$defs|definitions)\/(.+)$/.exec(schema.$ref);
    const target = match && root?.[match[1]]?.[decodeURIComponent(match[2])];
    if (target) {
      seen.add(schema.$ref);
      const { $ref, ...rest } = schema;
      return resolve({ ...target, ...rest }, root, seen);
    }
  }
  return schema ?? {};
}

/** `anyOf: [X, {type: null}]` (an Optional field) is X, not required. */
function withoutNull(schema) {
  const alternatives = schema.anyOf ?? schema.oneOf;
  if (!Array.isArray(alternatives)) return schema;
  const others = alternatives.filter((option) => option?.type !== "null");
  if (others.length !== 1 || others.length === alternatives.length) return schema;
  const { anyOf, oneOf, ...rest } = schema;
  return { ...others[0], ...rest, nullable: true };
}

function typeOf(schema) {
  if (Array.isArray(schema.type)) {
    const types = schema.type.filter((type) => type !== "null");
    return types.length === 1 ? types[0] : undefined;
  }
  return schema.type;
}

function labelFor(name, schema, required) {
  return el(
    "span", { class: "field-name" },
    String(name), required ? el("abbr", { title: "required" }, "*") : null,
    schema.description ? el("span", { class: "hint" }, ` ${schema.description}`) : null,
  );
}

/** An editor: `{node, read()}`; `read()` returns the value, or undefined for "leave out". */
function editorFor(rawSchema, root, path) {
  const schema = withoutNull(resolve(rawSchema, root));
  if (Array.isArray(schema.enum)) return enumEditor(schema, path);
  switch (typeOf(schema)) {
    case "string": return inputEditor(schema, path, "text", (text) => text);
    case "integer": return inputEditor(schema, path, "number", (text) => integer(text, path));
    case "number": return inputEditor(schema, path, "number", (text) => number(text, path));
    case "boolean": return booleanEditor(schema, path);
    case "array": return arrayEditor(schema, root, path);
    case "object": return schema.properties ? objectEditor(schema, root, path) : jsonEditor(schema, path);
    default: return jsonEditor(schema, path);
  }
}

function number(text, path) {
  const value = Number(text);
  if (!Number.isFinite(value)) throw new FormError(`${path}: not a number`);
  return value;
}

function integer(text, path) {
  const value = number(text, path);
  if (!Number.isInteger(value)) throw new FormError(`${path}: not an integer`);
  return value;
}

function inputEditor(schema, path, type, parse) {
  const input = el("input", { type, name: path, step: type === "number" ? "any" : null });
  if (schema.default !== undefined && schema.default !== null) input.value = String(schema.default);
  return {
    node: input,
    read: () => (input.value === "" && (type !== "text" || schema.nullable) ? undefined : parse(input.value)),
  };
}

function enumEditor(schema, path) {
  const select = el("select", { name: path });
  if (schema.nullable || schema.default === undefined) select.append(el("option", { value: "" }, "—"));
  for (const choice of schema.enum) {
    const option = el("option", { value: JSON.stringify(choice) }, typeof choice === "string" ? choice : JSON.stringify(choice));
    if (JSON.stringify(choice) === JSON.stringify(schema.default)) option.selected = true;
    select.append(option);
  }
  return { node: select, read: () => (select.value === "" ? undefined : JSON.parse(select.value)) };
}

function booleanEditor(schema, path) {
  const box = el("input", { type: "checkbox", name: path, checked: schema.default === true });
  return { node: box, read: () => box.checked };
}

function arrayEditor(schema, root, path) {
  const items = [];
  const list = el("ol", { class: "array-items" });
  const add = () => {
    const editor = editorFor(schema.items ?? {}, root, `${path}.${items.length}`);
    const entry = { editor };
    const remove = el("button", {
      type: "button", class: "small", onclick: () => {
        items.splice(items.indexOf(entry), 1);
        entry.node.remove();
      },
    }, "remove");
    entry.node = el("li", {}, editor.node, remove);
    items.push(entry);
    list.append(entry.node);
  };
  for (const _ of Array.isArray(schema.default) ? schema.default : []) add();
  const node = el("div", { class: "array", dataset: { field: path } }, list,
    el("button", { type: "button", class: "small", name: `${path}+`, onclick: add }, "add item"));
  return { node, read: () => items.map(({ editor }) => editor.read() ?? null) };
}

function objectEditor(schema, root, path) {
  const required = new Set(schema.required ?? []);
  const fields = Object.entries(schema.properties).map(([name, property]) => {
    const fieldPath = path ? `${path}.${name}` : name;
    const resolved = withoutNull(resolve(property, root));
    return { name, editor: editorFor(property, root, fieldPath), required: required.has(name), schema: resolved };
  });
  const node = el(
    path ? "fieldset" : "div", { class: "object", dataset: { field: path } },
    path ? el("legend", {}, path) : null,
    fields.map(({ name, editor, required, schema }) =>
      el("label", { class: "field" }, labelFor(name, schema, required), editor.node)),
  );
  return {
    node,
    read: () => {
      const value = {};
      for (const { name, editor, required } of fields) {
        const fieldValue = editor.read();
        if (fieldValue === undefined) {
          if (required) throw new FormError(`${path ? `${path}.` : ""}${name} is required`);
        } else {
          value[name] = fieldValue;
        }
      }
      return value;
    },
  };
}

function jsonEditor(schema, path) {
  const area = el("textarea", { name: path, rows: 3, class: "json", spellcheck: "false" });
  if (schema.default !== undefined) area.value = JSON.stringify(schema.default);
  return {
    node: area,
    read: () => {
      if (area.value.trim() === "") return undefined;
      try {
        return JSON.parse(area.value);
      } catch (error) {
        throw new FormError(`${path || "input"}: not JSON (${error.message})`);
      }
    },
  };
}

/**
 * The input form of one tool: `{node, read()}`, where `read()` is the tool
 * input (an object). A "raw JSON" switch replaces the form by a JSON editor
 * prefilled with what the form holds.
 */
export function toolForm(inputSchema) {
  const schema = withoutNull(resolve(inputSchema ?? {}, inputSchema));
  const generated = typeOf(schema) === "object" && schema.properties ? objectEditor(schema, inputSchema, "") : null;
  const raw = el("textarea", { class: "json raw-input", rows: 5, spellcheck: "false", name: "raw-json" });
  raw.value = "{}";
  const rawSwitch = el("input", { type: "checkbox", class: "raw-switch", name: "raw-switch" });
  const formPart = el("div", { class: "generated" }, generated ? generated.node : "no form for this schema: edit the JSON");
  const rawPart = el("div", { class: "raw", hidden: !!generated }, raw);
  rawSwitch.checked = !generated;
  rawSwitch.disabled = !generated;
  rawSwitch.addEventListener("change", () => {
    if (rawSwitch.checked) {
      try {
        raw.value = pretty(generated.read());
      } catch {
        // Keep what the JSON editor held.
      }
    }
    formPart.hidden = rawSwitch.checked;
    rawPart.hidden = !rawSwitch.checked;
  });
  formPart.hidden = !generated;
  const node = el("div", { class: "tool-form" }, formPart, rawPart,
    el("label", { class: "switch" }, rawSwitch, " raw JSON"));
  return {
    node,
    read: () => {
      if (!rawSwitch.checked) return generated.read();
      let value;
      try {
        value = JSON.parse(raw.value);
      } catch (error) {
        throw new FormError(`not JSON (${error.message})`);
      }
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        throw new FormError("the input must be a JSON object");
      }
      return value;
    },
  };
}
