/**
 * Function calling (OpenAI-style tools) for a service's capabilities.
 *
 * `tools` turns what discovery shows an actor on the `openai` surface into
 * tool definitions; `call` takes a tool call as the model produced it (the
 * function's name and its arguments as JSON text) and returns the content of
 * the tool message, a JSON string:
 *
 *     const defs = await tools(rt, { actor, strict: true });
 *     // ... the model answers with a tool call ...
 *     const content = await call(rt, fn.name, fn.arguments, { actor });
 *     messages.push({ role: "tool", tool_call_id: id, content });
 *
 * Function names allow only `[A-Za-z0-9_-]`, so a capability id's dots
 * become hyphens, which ids never contain: `orders.refund` is the function
 * `orders-refund`. An id longer than 64 characters is left out.
 */

import { parseJson } from "../canonical.js";
import type { DiscoveredCapability } from "../capability.js";
import type { Json, JsonObject } from "../errors.js";
import type { Runtime } from "../runtime.js";
import type { Schema } from "../schema.js";
import { answer } from "./translate.js";

export const SURFACE = "openai";
/** The longest function name the API accepts. */
export const MAX_NAME_LENGTH = 64;

/** A tool definition in the Chat Completions format. */
export interface FunctionTool {
  type: "function";
  function: {
    name: string;
    description?: string;
    parameters: Schema;
    strict?: boolean;
  };
}

/** The function name of a capability: `orders.refund` -> `orders-refund`. */
export function toolName(capabilityId: string): string {
  return capabilityId.replaceAll(".", "-");
}

/** The capability a function name stands for: `orders-refund` -> `orders.refund`. */
export function capabilityId(toolName: string): string {
  return toolName.replaceAll("-", ".");
}

/**
 * The tool definitions an actor may see: one per capability this runtime
 * serves that discovery shows on the `openai` surface.
 *
 * With `strict: true` each definition is for OpenAI's strict mode
 * (Structured Outputs): `strict: true`, every object closed with
 * `additionalProperties: false`, every property required, and the optional
 * ones nullable; `call` turns those nulls back into absent fields.
 *
 * @throws CapabilityError UNAUTHENTICATED or GOVERNANCE_UNAVAILABLE (`toModel()` is its face).
 */
export async function tools(
  runtime: Runtime,
  options: { actor: string | null; context?: JsonObject; strict?: boolean },
): Promise<FunctionTool[]> {
  const discovered = await runtime.discover({
    actor: options.actor,
    surface: SURFACE,
    context: options.context ?? {},
  });
  return definitions(runtime, discovered, options.strict ?? false);
}

/** The definition of one capability (exported for the conformance vectors). */
export function definition(capability: DiscoveredCapability, strict: boolean): FunctionTool {
  const fn: FunctionTool["function"] = {
    name: toolName(capability.id),
    ...(capability.description ? { description: capability.description } : {}),
    parameters: strict ? strictSchema(capability.inputSchema) : capability.inputSchema,
    ...(strict ? { strict: true } : {}),
  };
  return { type: "function", function: fn };
}

function definitions(
  runtime: Runtime,
  discovered: DiscoveredCapability[],
  strict: boolean,
): FunctionTool[] {
  const served = runtime.capabilities;
  return discovered
    .filter((c) => served.has(c.id) && toolName(c.id).length <= MAX_NAME_LENGTH)
    .map((c) => definition(c, strict));
}

/** Keywords strict mode refuses; they stay in the registered schema, checked by the plane. */
const UNSUPPORTED = new Set(["default", "title", "$schema"]);
/** Keywords whose value maps names to schemas (the names are not keywords). */
const SCHEMA_MAPS = new Set(["properties", "$defs", "definitions", "patternProperties"]);
/** Keywords whose value is data, not a schema. */
const VALUES = new Set(["const", "enum", "examples", "required"]);

type Node = Record<string, unknown>;

function isNode(value: unknown): value is Node {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/**
 * A JSON Schema in the form strict mode accepts: objects closed, every
 * property required, the optional ones nullable.
 */
export function strictSchema(schema: Schema): Schema {
  return strictNode(schema) as Schema;
}

function strictNode(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(strictNode);
  if (!isNode(node)) return node;
  const out: Node = {};
  for (const [key, value] of Object.entries(node)) {
    if (UNSUPPORTED.has(key)) continue;
    if (SCHEMA_MAPS.has(key) && isNode(value)) {
      out[key] = Object.fromEntries(Object.entries(value).map(([k, v]) => [k, strictNode(v)]));
    } else if (VALUES.has(key)) {
      out[key] = value;
    } else {
      out[key] = strictNode(value);
    }
  }
  if (node.type === "object" || "properties" in node) {
    const properties = (out.properties ?? {}) as Node;
    const required = new Set(Array.isArray(node.required) ? (node.required as string[]) : []);
    for (const [name, property] of Object.entries(properties)) {
      if (!required.has(name)) properties[name] = nullable(property);
    }
    out.properties = properties;
    out.required = Object.keys(properties);
    out.additionalProperties = false;
  }
  return out;
}

function nullable(schema: unknown): unknown {
  if (!isNode(schema)) return schema;
  if (typeof schema.type === "string" && !("enum" in schema) && !("const" in schema)) {
    return schema.type === "null" ? schema : { ...schema, type: [schema.type, "null"] };
  }
  if (Array.isArray(schema.type))
    return schema.type.includes("null") ? schema : { ...schema, type: [...schema.type, "null"] };
  const anyOf = Array.isArray(schema.anyOf) ? schema.anyOf : [];
  if (anyOf.some((s) => isNode(s) && s.type === "null" && Object.keys(s).length === 1))
    return schema;
  return { anyOf: [schema, { type: "null" }] };
}

/**
 * Invoke the capability a tool call names and answer with the tool message
 * content: compact, key-sorted JSON of the output without its model-hidden
 * fields, or the error's model-safe shape. Every call reaches the plane and
 * is audited, whatever its name or arguments.
 *
 * Nulls a strict-mode model wrote for optional properties are taken as
 * absent (with `strict` unset, arguments pass as the model wrote them).
 */
export async function call(
  runtime: Runtime,
  name: string,
  args: string,
  options: { actor: string | null; context?: JsonObject; signal?: AbortSignal; strict?: boolean },
): Promise<string> {
  const id = capabilityId(name);
  const spec = runtime.capabilities.get(id);
  const input = options.strict && spec ? strictArguments(args, spec.inputSchema) : args;
  const envelope = await runtime.invoke(id, input, {
    actor: options.actor,
    context: options.context ?? {},
    surface: SURFACE,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  return answer(envelope).text;
}

/**
 * The arguments a strict-mode model wrote, with the nulls it had to write for
 * optional properties taken out, at any depth (through `$ref`, `anyOf` and
 * array items). Text that is not JSON is returned as it is, for the plane to
 * answer and record.
 */
export function strictArguments(args: string, schema: Schema): string | Json {
  let value: Json;
  try {
    value = parseJson(args);
  } catch {
    return args; // the plane answers INPUT_INVALID at stage adapter, and records it
  }
  return dropNulls(value, schema, schema as Node);
}

function dropNulls(value: Json, schema: unknown, root: Node): Json {
  if (Array.isArray(value)) {
    const items = resolve(schema, root).items;
    return value.map((item) => dropNulls(item, branch(item, items, root), root));
  }
  if (value === null || typeof value !== "object") return value;
  const node = branch(value, schema, root);
  const properties = isNode(node.properties) ? node.properties : {};
  const required = new Set(Array.isArray(node.required) ? (node.required as string[]) : []);
  const out: JsonObject = {};
  for (const [key, item] of Object.entries(value)) {
    if (item === null && key in properties && !required.has(key)) continue;
    out[key] = dropNulls(item, properties[key], root);
  }
  return out;
}

/** A schema with its local references (`#/$defs/Name`) followed. */
function resolve(schema: unknown, root: Node): Node {
  let node = schema;
  for (let depth = 0; depth < 32; depth++) {
    const ref = isNode(node) ? node.$ref : undefined;
    if (typeof ref !== "string" || !ref.startsWith("#")) break;
    let target: unknown = root;
    for (const part of ref.slice(1).split("/").filter(Boolean)) {
      const name = part.replaceAll("~1", "/").replaceAll("~0", "~");
      target = isNode(target) ? target[name] : undefined;
    }
    node = target;
  }
  return isNode(node) ? node : {};
}

/** The schema a value is read by: the first `anyOf`/`oneOf` branch of its kind. */
function branch(value: Json, schema: unknown, root: Node): Node {
  const node = resolve(schema, root);
  const kind = Array.isArray(value) ? "array" : isNode(value) ? "object" : null;
  const options = [
    ...(Array.isArray(node.anyOf) ? node.anyOf : []),
    ...(Array.isArray(node.oneOf) ? node.oneOf : []),
  ];
  for (const option of options) {
    const b = resolve(option, root);
    if (b.type === kind || (kind === "object" && "properties" in b)) return b;
  }
  return node;
}
