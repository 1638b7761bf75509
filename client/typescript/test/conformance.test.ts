/**
 * The conformance vectors of tests/conformance/, run by the TypeScript SDK.
 * The Python SDK runs the same files (tests/contract/test_conformance.py).
 */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { toolResult, UNKNOWN_TOOL } from "../src/adapters/mcp.js";
import { strictArguments, strictSchema } from "../src/adapters/openai.js";
import { answer } from "../src/adapters/translate.js";
import { canonicalJson, digest, NotCanonicalizable, parseJson } from "../src/canonical.js";
import { type Envelope, failed, succeeded, suspended, unwrap } from "../src/envelope.js";
import { CapabilityError, type Json, type JsonObject } from "../src/errors.js";
import { GrantVerificationError, verifyGrant } from "../src/grants.js";
import { mayRetry, type SideEffect } from "../src/retry.js";
import { redact, type Schema, sensitiveTexts, stripModelHidden } from "../src/schema.js";
import { VECTORS } from "./paths.js";

// biome-ignore lint/suspicious/noExplicitAny: vectors are JSON of many shapes
type Case = any;

function load(name: string): { cases: Case[]; [key: string]: unknown } {
  return JSON.parse(readFileSync(join(VECTORS, name), "utf8"));
}

function errorOf(spec: Case): CapabilityError {
  return new CapabilityError(spec.code, spec.public_message, {
    stage: spec.stage,
    retryable: spec.retryable,
    exposeToModel: spec.expose_to_model,
    details: spec.details,
  });
}

function envelopeOf(spec: Case): Envelope {
  if (spec.status === "succeeded") {
    return succeeded("inv", spec.output, stripModelHidden(spec.output, spec.output_schema ?? {}));
  }
  const error = errorOf(spec.error);
  const base =
    spec.status === "suspended"
      ? suspended("inv", error, spec.approval_id)
      : failed("inv", error, spec.executed_before_failure ?? false);
  return { ...base, replayedFrom: spec.replayed ? "original" : null };
}

const grantKeys = load("grants.json").keys as Record<
  string,
  { key_id: string; public_key_pem: string }
>;

const RUNNERS: Record<string, (c: Case) => void | Promise<void>> = {
  "errors.json": (c) => {
    const error = errorOf(c.error);
    assert.equal(error.stage, c.expect.stage);
    assert.equal(error.publicMessage, c.expect.public_message);
    assert.equal(error.retryable, c.expect.retryable);
    assert.equal(error.exposeToModel, c.expect.expose_to_model);
    assert.deepEqual(error.toModel(), c.expect.model);
    assert.equal(answer(failed("inv", error)).text, c.expect.model_json);
    assert.equal(JSON.stringify(error), JSON.stringify(error.toModel()));
  },
  "envelopes.json": (c) => {
    const envelope = envelopeOf(c.envelope);
    if ("returns" in c.expect) {
      assert.deepEqual(unwrap(envelope), c.expect.returns);
      return;
    }
    assert.throws(
      () => unwrap(envelope),
      (thrown: unknown) => {
        assert.ok(thrown instanceof CapabilityError);
        assert.deepEqual(thrown.toModel(), c.expect.throws);
        return true;
      },
    );
  },
  "retries.json": (c) => {
    const verdict = mayRetry(
      envelopeOf(c.envelope),
      c.side_effect as SideEffect | null,
      c.idempotency_key,
    );
    assert.equal(verdict, c.expect);
  },
  "canonical.json": (c) => {
    if (c.refused) {
      assert.throws(() => canonicalJson(parseJson(c.json)), NotCanonicalizable);
      return;
    }
    const value = parseJson(c.json);
    assert.equal(canonicalJson(value), c.canonical);
    assert.equal(digest(value), c.digest);
  },
  "grants.json": (c) => {
    const keys = (c.keys as string[]).map((k) => ({
      keyId: grantKeys[k]?.key_id ?? "",
      publicKeyPem: grantKeys[k]?.public_key_pem ?? "",
    }));
    const verify = () =>
      verifyGrant(c.token, keys, {
        capabilityId: c.capability_id,
        input: c.input,
        now: c.now,
        leewayS: c.leeway_s,
      });
    if ("claims" in c.expect) {
      const claims = verify();
      const e = c.expect.claims;
      assert.deepEqual(claims, {
        invocationId: e.invocation_id,
        capabilityId: e.capability_id,
        capabilityVersion: e.capability_version,
        service: e.service,
        actorId: e.actor_id,
        inputDigest: e.input_digest,
        expiresAt: e.expires_at,
      });
      return;
    }
    assert.throws(verify, (thrown: unknown) => {
      assert.ok(thrown instanceof GrantVerificationError);
      assert.equal(thrown.reason, c.expect.refused);
      return true;
    });
  },
  "markings.json": (c) => {
    const schema = c.schema as Schema;
    assert.deepEqual(redact(c.value, schema), c.expect.redacted);
    assert.deepEqual(stripModelHidden(c.value, schema), c.expect.model_visible);
    const texts = sensitiveTexts(c.value, schema);
    for (const text of c.expect.sensitive_texts as string[]) assert.ok(texts.has(text), text);
  },
  "adapters.json": (c) => {
    const result = answer(envelopeOf(c.envelope));
    assert.equal(result.text, c.expect.openai);
    if (result.concealsCapability) {
      assert.deepEqual(
        { error: { code: -32602, message: UNKNOWN_TOOL, data: result.value } },
        c.expect.mcp,
      );
      return;
    }
    assert.deepEqual({ result: toolResult(result) }, c.expect.mcp);
  },
  "strict-tools.json": (c) => {
    if ("strict" in c.expect) {
      assert.deepEqual(strictSchema(c.schema), c.expect.strict);
      return;
    }
    const passed = strictArguments(c.arguments, c.schema);
    if ("text" in c.expect) assert.equal(passed, c.expect.text);
    else assert.deepEqual(passed, c.expect.arguments);
  },
};

const files = Object.keys(RUNNERS).sort();
const registered: string[] = [];

for (const file of files) {
  describe(file, () => {
    for (const c of load(file).cases) {
      registered.push(`${file}:${c.name}`);
      test(c.name, () => RUNNERS[file]?.(c));
    }
  });
}

describe("the conformance suite", () => {
  test("has a runner for every vector file", () => {
    const onDisk = readdirSync(VECTORS)
      .filter((f) => f.endsWith(".json"))
      .sort();
    assert.deepEqual(onDisk, files);
  });

  test("reads every case, counted from the files themselves", () => {
    const onDisk = new Set<string>();
    let total = 0;
    for (const f of readdirSync(VECTORS).filter((name) => name.endsWith(".json"))) {
      const cases = (JSON.parse(readFileSync(join(VECTORS, f), "utf8")) as { cases: JsonObject[] })
        .cases;
      assert.ok(cases.length > 0, `${f} has no cases`);
      total += cases.length;
      for (const c of cases) onDisk.add(`${f}:${c.name as Json}`);
    }
    assert.equal(onDisk.size, total, "case names must be unique within a file");
    assert.deepEqual(new Set(registered), onDisk);
  });
});
