/**
 * JSON Schema 2020-12 as the SDK uses it: output validation, and the
 * `x-warden-*` markings (SI-5): sensitive fields are masked out of every
 * diagnostic, model-hidden fields are stripped before a model sees an output.
 *
 * Markings are found through `$ref`, `allOf`/`anyOf`/`oneOf`, `then`/`else`,
 * properties, pattern and additional properties, and array items, exactly as
 * the Python SDK finds them; where branches disagree a field is marked if any
 * branch marks it.
 */

import { Ajv2020 } from "ajv/dist/2020.js";
import type { Json } from "./errors.js";

export type Schema = { readonly [key: string]: unknown };

export const SENSITIVE = "x-warden-sensitive";
export const MODEL_VISIBLE = "x-warden-model-visible";
export const REDACTED = "[REDACTED]";
/** Shorter values are not searched for in free text: masking every "1" protects nothing. */
export const MIN_SCRUB_CHARS = 3;

/** One validation problem: where it is and what is wrong, never the value. */
export interface Issue {
  path: string;
  message: string;
}

const ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: false });
for (const keyword of [SENSITIVE, MODEL_VISIBLE]) ajv.addKeyword(keyword);

/** A compiled validator: the issues of a value, or none. */
export type Validate = (value: unknown) => Issue[];

/**
 * Compile a JSON Schema once per capability.
 *
 * @throws Error the schema is not a valid JSON Schema 2020-12.
 */
export function compileValidator(schema: Schema): Validate {
  const check = ajv.compile(schema);
  return (value) => {
    if (check(value)) return [];
    return (check.errors ?? [])
      .map((e) => ({ path: e.instancePath, message: e.message ?? "is invalid" }))
      .sort((a, b) => (a.path + a.message < b.path + b.message ? -1 : 1));
  };
}

const DROP = Symbol("drop");
type Replace = (value: Json) => Json | typeof DROP;

/** A copy of `value` with every field marked `x-warden-sensitive` replaced. */
export function redact(
  value: Json,
  schema: Schema,
  replace: (value: Json) => Json = () => REDACTED,
): Json {
  const out = walk(value, [schema], schema, SENSITIVE, true, replace);
  return out === DROP ? null : out;
}

/**
 * A copy of `value` without the fields marked `x-warden-model-visible: false`
 * (array items become null, keeping positions; a hidden root becomes null).
 */
export function stripModelHidden(value: Json, schema: Schema): Json {
  const out = walk(value, [schema], schema, MODEL_VISIBLE, false, () => DROP);
  return out === DROP ? null : out;
}

/**
 * The text forms of every sensitive string and number in `value`: as written
 * and JSON-escaped, so that an error message or a stack quoting it is found.
 */
export function sensitiveTexts(value: Json, schema: Schema): Set<string> {
  const found = new Set<string>();
  const collect = (sensitive: Json): Json => {
    for (const text of scalarTexts(sensitive)) found.add(text);
    return REDACTED;
  };
  walk(value, [schema], schema, SENSITIVE, true, collect);
  return new Set([...found].filter((text) => text.length >= MIN_SCRUB_CHARS));
}

/** An input issue's message in place of one that repeats a value of the input. */
export const VALIDATION_REFUSED = "was refused by the capability's validation";

/** The text forms of every string and number in `value` long enough to search for. */
export function valueTexts(value: Json): Set<string> {
  return new Set([...scalarTexts(value)].filter((text) => text.length >= MIN_SCRUB_CHARS));
}

/**
 * An input issue's message, or `VALIDATION_REFUSED` when it repeats a value of
 * the input: a validator's own text may quote what it refused, and issue
 * messages never echo values (SPEC §1, SI-5).
 */
export function unechoed(message: string, texts: Iterable<string>): string {
  for (const text of texts) if (message.includes(text)) return VALIDATION_REFUSED;
  return message;
}

function* scalarTexts(value: Json): Generator<string> {
  if (Array.isArray(value)) {
    for (const child of value) yield* scalarTexts(child);
  } else if (value !== null && typeof value === "object") {
    for (const child of Object.values(value)) yield* scalarTexts(child);
  } else if (typeof value === "string") {
    yield value;
    yield JSON.stringify(value).slice(1, -1);
  } else if (typeof value === "number") {
    yield String(value);
  }
}

/** `text` with every occurrence of each secret masked, longest first. */
export function scrubText(text: string, secrets: Iterable<string>): string {
  const ordered = [...secrets].sort((a, b) => b.length - a.length);
  let out = text;
  for (const secret of ordered) out = out.split(secret).join(REDACTED);
  return out;
}

/** A copy of `value` whose strings (and keys) have every secret masked. */
export function scrubJson(value: Json, secrets: ReadonlySet<string>): Json {
  if (secrets.size === 0) return value;
  const scrub = (node: Json): Json => {
    if (typeof node === "string") return scrubText(node, secrets);
    if (Array.isArray(node)) return node.map(scrub);
    if (node !== null && typeof node === "object") {
      return Object.fromEntries(
        Object.entries(node).map(([k, v]) => [scrubText(k, secrets), scrub(v)]),
      );
    }
    if (typeof node === "number") {
      const text = String(node);
      return [...secrets].some((s) => text.includes(s)) ? REDACTED : node;
    }
    return node;
  };
  return scrub(value);
}

function walk(
  value: Json,
  schemas: Schema[],
  root: Schema,
  marking: string,
  marked: unknown,
  replace: Replace,
): Json | typeof DROP {
  const expanded = expand(schemas, root);
  if (expanded.some((s) => s[marking] === marked)) return replace(value);
  if (Array.isArray(value)) {
    return value.map((child, index) => {
      const out = walk(child, itemSchemas(expanded, index), root, marking, marked, replace);
      return out === DROP ? null : out;
    });
  }
  if (value !== null && typeof value === "object") {
    const result: { [key: string]: Json } = {};
    for (const [key, child] of Object.entries(value)) {
      const out = walk(child, propertySchemas(expanded, key), root, marking, marked, replace);
      if (out !== DROP) result[key] = out;
    }
    return result;
  }
  return value;
}

function isSchema(value: unknown): value is Schema {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function expand(schemas: Schema[], root: Schema): Schema[] {
  const out: Schema[] = [];
  const pending = [...schemas];
  const seen = new Set<Schema>();
  while (pending.length > 0) {
    const schema = pending.pop();
    if (!isSchema(schema) || seen.has(schema)) continue;
    seen.add(schema);
    out.push(schema);
    const ref = schema.$ref;
    if (typeof ref === "string" && ref.startsWith("#")) {
      const target = resolve(root, ref);
      if (target) pending.push(target);
    }
    for (const combinator of ["allOf", "anyOf", "oneOf"]) {
      const branches = schema[combinator];
      if (Array.isArray(branches)) pending.push(...branches.filter(isSchema));
    }
    for (const conditional of ["then", "else"]) {
      const branch = schema[conditional];
      if (isSchema(branch)) pending.push(branch);
    }
  }
  return out;
}

function resolve(root: Schema, ref: string): Schema | null {
  let node: unknown = root;
  for (const raw of ref.slice(1).split("/").slice(1)) {
    const part = raw.replaceAll("~1", "/").replaceAll("~0", "~");
    if (Array.isArray(node) && /^\d+$/.test(part)) node = node[Number(part)];
    else if (isSchema(node) && part in node) node = node[part];
    else return null;
  }
  return isSchema(node) ? node : null;
}

function propertySchemas(schemas: Schema[], key: string): Schema[] {
  const found: Schema[] = [];
  for (const schema of schemas) {
    const properties = isSchema(schema.properties) ? schema.properties : {};
    const own = properties[key];
    if (Object.hasOwn(properties, key) && isSchema(own)) {
      found.push(own);
      continue;
    }
    const patterns = isSchema(schema.patternProperties) ? schema.patternProperties : {};
    const matched = Object.entries(patterns)
      .filter(([pattern]) => matches(pattern, key))
      .map(([, s]) => s)
      .filter(isSchema);
    found.push(...matched);
    if (matched.length === 0 && isSchema(schema.additionalProperties)) {
      found.push(schema.additionalProperties);
    }
  }
  return found;
}

function itemSchemas(schemas: Schema[], index: number): Schema[] {
  const found: Schema[] = [];
  for (const schema of schemas) {
    const prefix = Array.isArray(schema.prefixItems) ? schema.prefixItems : [];
    if (index < prefix.length && isSchema(prefix[index])) found.push(prefix[index] as Schema);
    else if (index >= prefix.length && isSchema(schema.items)) found.push(schema.items);
  }
  return found;
}

/** A pattern that does not compile counts as matching: a marking is never lost. */
function matches(pattern: string, key: string): boolean {
  try {
    return new RegExp(pattern, "u").test(key);
  } catch {
    return true;
  }
}
