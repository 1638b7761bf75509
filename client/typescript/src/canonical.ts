/**
 * Canonical JSON (RFC 8785) and the digests built on it.
 *
 * An approver approves exactly these arguments and a grant is bound to
 * exactly this input: both rest on one canonical form, which must be the
 * same bytes in every language (the conformance vectors in
 * `tests/conformance/canonical.json` hold the Python and TypeScript SDKs to it).
 */

import { createHash } from "node:crypto";
import type { Json } from "./errors.js";

/**
 * A value has no RFC 8785 form: an integer beyond ±(2^53 - 1), NaN or an
 * infinity, a string with a lone surrogate, or something that is not JSON.
 */
export class NotCanonicalizable extends Error {
  override readonly name = "NotCanonicalizable";
}

/** The RFC 8785 canonical serialization of a JSON value, as text. */
export function canonicalJson(value: unknown): string {
  return write(value, 0);
}

const MAX_DEPTH = 64;

function write(value: unknown, depth: number): string {
  if (value === null) return "null";
  switch (typeof value) {
    case "boolean":
      return value ? "true" : "false";
    case "number":
      if (!Number.isFinite(value)) throw new NotCanonicalizable(`${value} is not a JSON number`);
      // ECMAScript's Number-to-String is RFC 8785's number form (-0 is "0").
      return JSON.stringify(value);
    case "bigint":
      if (value > BigInt(Number.MAX_SAFE_INTEGER) || value < -BigInt(Number.MAX_SAFE_INTEGER)) {
        throw new NotCanonicalizable("an integer beyond ±(2^53 - 1) has no canonical form");
      }
      return String(value);
    case "string":
      if (!value.isWellFormed()) throw new NotCanonicalizable("a string has a lone surrogate");
      return JSON.stringify(value);
    case "object": {
      if (depth >= MAX_DEPTH) throw new NotCanonicalizable(`nested more than ${MAX_DEPTH} deep`);
      if (Array.isArray(value)) {
        return `[${value.map((item) => write(item, depth + 1)).join(",")}]`;
      }
      const entries = Object.entries(value as Record<string, unknown>).filter(
        ([, item]) => item !== undefined,
      );
      // RFC 8785 orders keys by their UTF-16 code units: JavaScript's own order.
      entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
      const members = entries.map(([key, item]) => {
        if (!key.isWellFormed()) throw new NotCanonicalizable("a key has a lone surrogate");
        return `${JSON.stringify(key)}:${write(item, depth + 1)}`;
      });
      return `{${members.join(",")}}`;
    }
    default:
      throw new NotCanonicalizable(`a ${typeof value} is not JSON`);
  }
}

// A JSON string token, or a number token (strings are matched first, so a
// number inside a string is never taken for one).
const TOKENS = /"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g;

/**
 * Parse JSON text as the plane and the Python SDK read it: an integer literal
 * (no fraction, no exponent) beyond ±(2^53 - 1) is an integer JavaScript
 * cannot hold, so it is refused rather than rounded into another value.
 *
 * @throws NotCanonicalizable such an integer; SyntaxError text that is not JSON.
 */
export function parseJson(text: string): Json {
  const value = JSON.parse(text) as Json;
  for (const [token] of text.matchAll(TOKENS)) {
    if (token.startsWith('"') || /[.eE]/.test(token)) continue;
    const digits = token.replace(/^-?0*/, "");
    if (digits.length >= 16 && BigInt(token.replace(/^-/, "")) > BigInt(Number.MAX_SAFE_INTEGER)) {
      throw new NotCanonicalizable("an integer beyond ±(2^53 - 1) has no canonical form");
    }
  }
  return value;
}

/** SHA-256 of the canonical form, as `sha256:<hex>`. */
export function digest(value: unknown): string {
  return `sha256:${createHash("sha256").update(canonicalJson(value), "utf8").digest("hex")}`;
}

/**
 * Compact, key-sorted JSON for the wire and for what a model is told: the
 * same bytes for the same value. Keys sort by code point, as Python's
 * `json.dumps(sort_keys=True)` sorts them (written by hand: an object's
 * integer-like keys would otherwise come first).
 */
export function compactJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map((item) => compactJson(item ?? null)).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>).filter(
      ([, item]) => item !== undefined,
    );
    entries.sort(([a], [b]) => byCodePoint(a, b));
    return `{${entries.map(([key, item]) => `${JSON.stringify(key)}:${compactJson(item)}`).join(",")}}`;
  }
  return JSON.stringify(value) ?? "null";
}

function byCodePoint(a: string, b: string): number {
  const x = [...a];
  const y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = (x[i]?.codePointAt(0) ?? 0) - (y[i]?.codePointAt(0) ?? 0);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}
