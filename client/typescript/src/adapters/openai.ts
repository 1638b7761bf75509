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

/**
 * A JSON Schema in the form strict mode accepts: objects closed, every
 * property required, the optional ones nullable.
 */
export function strictSchema(schema: Schema): Schema {
  return strictNode(schema) as Schema;
}

function strictNode(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(strictNode);
  if (node === null || typeof node !== "object") return node;
  const source = node as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(source)) {
    if (UNSUPPORTED.has(key)) continue;
    if (key === "properties" && value !== null && typeof value === "object") {
      out.properties = Object.fromEntries(
        Object.entries(value as Record<string, unknown>).map(([k, v]) => [k, strictNode(v)]),
      );
    } else if (key === "const" || key === "enum") {
      out[key] = value;
    } else {
      out[key] = strictNode(value);
    }
  }
  if (source.type === "object" || "properties" in source) {
    const properties = (out.properties ?? {}) as Record<string, unknown>;
    const required = new Set(Array.isArray(source.required) ? (source.required as string[]) : []);
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
  if (schema === null || typeof schema !== "object") return schema;
  const s = schema as Record<string, unknown>;
  if (typeof s.type === "string" && !("enum" in s) && !("const" in s)) {
    return s.type === "null" ? s : { ...s, type: [s.type, "null"] };
  }
  if (Array.isArray(s.type))
    return s.type.includes("null") ? s : { ...s, type: [...s.type, "null"] };
  return { anyOf: [s, { type: "null" }] };
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
  const input = options.strict && spec ? withoutOptionalNulls(args, spec.inputSchema) : args;
  const envelope = await runtime.invoke(id, input, {
    actor: options.actor,
    context: options.context ?? {},
    surface: SURFACE,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  return answer(envelope).text;
}

function withoutOptionalNulls(args: string, schema: Schema): string | Json {
  let value: Json;
  try {
    value = parseJson(args);
  } catch {
    return args; // the plane answers INPUT_INVALID at stage adapter, and records it
  }
  return dropNulls(value, schema);
}

function dropNulls(value: Json, schema: unknown): Json {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return value;
  if (schema === null || typeof schema !== "object") return value;
  const s = schema as Record<string, unknown>;
  const properties = (s.properties ?? {}) as Record<string, unknown>;
  const required = new Set(Array.isArray(s.required) ? (s.required as string[]) : []);
  const out: JsonObject = {};
  for (const [key, item] of Object.entries(value)) {
    if (item === null && !required.has(key) && key in properties) continue;
    out[key] = dropNulls(item, properties[key]);
  }
  return out;
}
