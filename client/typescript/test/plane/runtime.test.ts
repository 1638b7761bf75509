/**
 * The TypeScript runtime against a real plane. Run by
 * tests/integration/test_typescript_sdk.py, which starts the plane and passes
 * its address, the billing service's token and an actor's JWT in the
 * environment (WARDEN_TARGET, WARDEN_SERVICE_TOKEN, WARDEN_ACTOR_TOKEN).
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { z } from "zod";
import { Governor } from "../../src/gen/warden/v1/governor_pb.js";
import { uuid7 } from "../../src/ids.js";
import {
  CapabilityError,
  type Envelope,
  type Json,
  type JsonObject,
  NO_RETRY,
  Runtime,
  unwrap,
  verifyGrant,
  WardenError,
} from "../../src/index.js";

const env = process.env;
const target = env.WARDEN_TARGET ?? "";
const token = env.WARDEN_SERVICE_TOKEN ?? "";
const actor = env.WARDEN_ACTOR_TOKEN ?? "";
const object = { type: "object" } as const;
const amountIn = {
  type: "object",
  properties: { amount: { type: "integer" }, card: { type: "string", "x-warden-sensitive": true } },
  required: ["amount"],
};
const ran: Record<string, number> = {};
const count = (name: string) => {
  ran[name] = (ran[name] ?? 0) + 1;
};
/** Declared error details the audit log cannot hold, by the amount that asks for them. */
const UNRECORDABLE: Record<number, JsonObject> = {
  2: { ratio: Number.NaN },
  3: { text: "x".repeat(64 * 1024) }, // its JSON is larger than the plane records
  4: { id: 2 ** 60 },
  5: { text: "\ud800" },
};
/** Calls made at once by the test of reports sent together. */
const TOGETHER = 100;
const fast = { maxAttempts: 3, initialBackoffMs: 1, maxBackoffMs: 5, multiplier: 2 };

function service(at = target, governanceTimeoutMs = 2_000): Runtime {
  const rt = new Runtime(at, { service: "billing", token, governanceTimeoutMs });
  rt.capability(
    {
      id: "billing.refuse",
      input: amountIn,
      output: object,
      errors: { NOT_ELIGIBLE: "This charge cannot be made." },
    },
    (input, ctx) => {
      count("refuse");
      const unrecordable = UNRECORDABLE[(input as { amount: number }).amount];
      throw ctx.errors.NOT_ELIGIBLE({ details: unrecordable ?? { hint: "smaller" } });
    },
  );
  rt.capability(
    { id: "billing.explode", input: amountIn, output: object },
    (input: { card?: string }) => {
      count("explode");
      throw new Error(`the table payments is locked for card ${input.card}`);
    },
  );
  rt.capability(
    {
      id: "billing.lie",
      input: amountIn,
      output: { type: "object", properties: { id: { type: "string" } }, required: ["id"] },
    },
    () => ({ id: 42 }),
  );
  rt.capability(
    { id: "billing.slow", input: amountIn, output: object, timeoutMs: 100 },
    (_input, ctx) =>
      new Promise<Json>((resolve) => {
        ctx.signal.addEventListener("abort", () => {
          count("slow-aborted");
          resolve({});
        });
      }),
  );
  rt.capability({ id: "billing.wait", input: amountIn, output: object }, (_input, ctx) => {
    count("wait");
    return new Promise<Json>((resolve) => ctx.signal.addEventListener("abort", () => resolve({})));
  });
  rt.capability({ id: "billing.look", input: amountIn, output: object, sideEffect: "read" }, () => {
    count("look");
    return {};
  });
  rt.capability(
    {
      id: "billing.pay",
      input: amountIn,
      output: { type: "object", properties: { n: { type: "integer" } } },
      validators: {
        input: z.object({
          amount: z
            .number()
            .max(1000, "at most 1000")
            .refine(
              (v) => v !== 777,
              (v) => ({ message: `${v} is an amount the ledger reserves` }),
            ),
        }),
      },
    },
    () => {
      count("pay");
      return { n: ran.pay ?? 0 };
    },
  );
  rt.capability({ id: "billing.pass", input: amountIn, output: object }, async (input, ctx) => {
    const keys = await rt.grantKeys();
    const claims = verifyGrant(ctx.grantToken, keys, { capabilityId: "billing.pass", input });
    // The same keys as a Map from key id to PEM, as the docs offer them.
    const pems = new Map(keys.map((k) => [k.keyId, k.publicKeyPem] as [string, string]));
    const again = verifyGrant(ctx.grantToken, pems, { capabilityId: "billing.pass", input });
    if (again.invocationId !== claims.invocationId)
      throw new Error("the Map verified another grant");
    return { actor: claims.actorId, capability: claims.capabilityId };
  });
  return rt;
}

const rt = service();

function failure(envelope: Envelope) {
  assert.notEqual(envelope.status, "succeeded");
  return envelope.error;
}

describe("a TypeScript service on a real plane", () => {
  test("registers its capabilities with versions", async () => {
    const registered = await rt.register();
    assert.equal(registered.length, 8);
    assert.ok(registered.every((r) => r.version !== "" && r.digest !== ""));
  });

  test("a declared error is exposed with its message, the handler having run once", async () => {
    const envelope = await rt.invoke("billing.refuse", { amount: 1 }, { actor });
    assert.equal(envelope.status, "failed");
    assert.deepEqual(failure(envelope)?.toModel(), {
      code: "NOT_ELIGIBLE",
      message: "This charge cannot be made.",
      retryable: false,
      details: { hint: "smaller" },
    });
    assert.equal(envelope.executedBeforeFailure, false);
    assert.equal(ran.refuse, 1);
  });

  test("a declared error whose details the audit log cannot hold is concealed", async () => {
    const warnings: string[] = [];
    const heard = (warning: Error) => warnings.push(warning.message);
    process.on("warning", heard);
    try {
      for (const amount of Object.keys(UNRECORDABLE).map(Number)) {
        const envelope = await rt.invoke("billing.refuse", { amount }, { actor });
        assert.deepEqual(failure(envelope)?.toModel(), {
          code: "INTERNAL_ERROR",
          message: "The operation failed.",
        });
        assert.equal(envelope.executedBeforeFailure, true);
      }
      await new Promise((settled) => setImmediate(settled));
    } finally {
      process.off("warning", heard);
    }
    // The plane took every report: none was refused for its details.
    assert.deepEqual(warnings, []);
  });

  test("an undeclared throw is concealed, and the handler ran", async () => {
    const envelope = await rt.invoke(
      "billing.explode",
      { amount: 1, card: "4111111111111111" },
      { actor },
    );
    assert.deepEqual(failure(envelope)?.toModel(), {
      code: "INTERNAL_ERROR",
      message: "The operation failed.",
    });
    assert.equal(envelope.executedBeforeFailure, true);
    assert.ok(failure(envelope)?.cause instanceof Error);
    assert.throws(() => unwrap(envelope), { code: "INTERNAL_ERROR" });
  });

  test("an output that breaks its schema is withheld and concealed", async () => {
    const envelope = await rt.invoke("billing.lie", { amount: 1 }, { actor });
    assert.equal(failure(envelope)?.code, "OUTPUT_INVALID");
    assert.equal(failure(envelope)?.stage, "output-validation");
    assert.equal(failure(envelope)?.toModel().code, "INTERNAL_ERROR");
    assert.equal(envelope.output, null);
    assert.equal(envelope.executedBeforeFailure, true);
  });

  test("the time budget aborts the handler's signal and answers TIMEOUT", async () => {
    const envelope = await rt.invoke("billing.slow", { amount: 1 }, { actor, retry: NO_RETRY });
    assert.equal(failure(envelope)?.code, "TIMEOUT");
    assert.equal(envelope.executedBeforeFailure, true);
    assert.equal(ran["slow-aborted"], 1);
  });

  test("an AbortSignal cancels a running call: status cancelled, never thrown", async () => {
    const controller = new AbortController();
    const pending = rt.invoke("billing.wait", { amount: 1 }, { actor, signal: controller.signal });
    while (!ran.wait) await new Promise((resolve) => setTimeout(resolve, 5));
    controller.abort();
    const envelope = await pending;
    assert.equal(envelope.status, "cancelled");
    assert.equal(failure(envelope)?.code, "CANCELLED");
    assert.equal(envelope.executedBeforeFailure, true);
  });

  test("a signal aborted before the call sends nothing", async () => {
    const envelope = await rt.invoke(
      "billing.look",
      { amount: 1 },
      {
        actor,
        signal: AbortSignal.abort(),
      },
    );
    assert.equal(envelope.status, "cancelled");
    assert.equal(ran.look, undefined);
  });

  test("a Standard Schema validator refines the input: INPUT_INVALID with issues, no values", async () => {
    const envelope = await rt.invoke("billing.pay", { amount: 5000 }, { actor });
    assert.deepEqual(failure(envelope)?.toModel(), {
      code: "INPUT_INVALID",
      message: "The input does not match the capability's schema.",
      retryable: false,
      details: { issues: [{ path: "/amount", message: "at most 1000" }] },
    });
    assert.equal(ran.pay, undefined);
  });

  test("an input holding Infinity (a model's 1e400) is INPUT_INVALID, never null", async () => {
    const envelope = await rt.invoke(
      "billing.pay",
      { amount: Number.POSITIVE_INFINITY },
      { actor },
    );
    const error = failure(envelope);
    assert.ok(error);
    assert.equal(error.code, "INPUT_INVALID");
    assert.equal(error.stage, "adapter");
    assert.deepEqual(error.details, { issues: [{ path: "", message: "must be a JSON document" }] });
  });

  test("an input larger than the plane reads is INPUT_INVALID, not an outage", async () => {
    const huge = { amount: 1, note: "x".repeat(3 * 1024 * 1024) };
    const error = failure(await rt.invoke("billing.pay", huge, { actor }));
    assert.ok(error);
    assert.deepEqual(error.toModel(), {
      code: "INPUT_INVALID",
      message: error.publicMessage,
      retryable: false,
      details: { issues: [{ path: "", message: "is larger than the plane reads" }] },
    });
  });

  test("a validator's message that repeats a value of the input is not the model's", async () => {
    const envelope = await rt.invoke("billing.pay", { amount: 777 }, { actor });
    const error = failure(envelope);
    assert.ok(error);
    assert.deepEqual(error.details, {
      issues: [{ path: "/amount", message: "was refused by the capability's validation" }],
    });
    assert.match(String(error.cause), /777 is an amount the ledger reserves/);
    assert.equal(ran.pay, undefined);
  });

  test("an idempotency key runs the handler once and replays its outcome", async () => {
    const first = await rt.invoke("billing.pay", { amount: 5 }, { actor, idempotencyKey: "k-1" });
    const again = await rt.invoke("billing.pay", { amount: 5 }, { actor, idempotencyKey: "k-1" });
    assert.deepEqual([first.status, again.status], ["succeeded", "succeeded"]);
    assert.deepEqual(again.output, first.output);
    assert.equal(again.replayedFrom, first.invocationId);
    assert.equal(ran.pay, 1);
    const other = await rt.invoke("billing.pay", { amount: 6 }, { actor, idempotencyKey: "k-1" });
    assert.equal(failure(other)?.code, "IDEMPOTENCY_CONFLICT");
    // A runtime that does not serve the capability cannot know its model-hidden
    // fields: a replay to it offers the model nothing.
    const bystander = new Runtime(target, { service: "billing", token });
    const seen = await bystander.invoke(
      "billing.pay",
      { amount: 5 },
      { actor, idempotencyKey: "k-1" },
    );
    assert.equal(seen.replayedFrom, first.invocationId);
    assert.ok(seen.status === "succeeded");
    assert.deepEqual(seen.output, first.output);
    assert.equal(seen.modelOutput, null);
  });

  test("close() closes a runtime's connections; a call after fails closed", async () => {
    const closing = service();
    const before = await closing.invoke("billing.pass", { amount: 1 }, { actor });
    assert.equal(before.status, "succeeded");
    closing.close();
    const after = await closing.invoke("billing.pass", { amount: 1 }, { actor, retry: NO_RETRY });
    assert.equal(failure(after)?.code, "GOVERNANCE_UNAVAILABLE");
  });

  test("a context that is not JSON (NaN, a BigInt) is the caller's error, thrown", async () => {
    const contexts: JsonObject[] = [{ ratio: Number.NaN }, { big: 10n as unknown as number }];
    for (const context of contexts) {
      await assert.rejects(
        rt.invoke("billing.pass", { amount: 3 }, { actor, context }),
        (error: unknown) =>
          error instanceof WardenError && /context is not JSON/.test(error.message),
      );
    }
  });

  test("an idempotency key longer than the plane takes is the caller's error, thrown", async () => {
    await assert.rejects(
      rt.invoke("billing.pass", { amount: 3 }, { actor, idempotencyKey: "k".repeat(256) }),
      (error: unknown) =>
        error instanceof WardenError && /longer than 255 characters \(256\)/.test(error.message),
    );
    // Characters as the plane counts them: 200 emoji are 400 UTF-16 units.
    const emoji = await rt.invoke(
      "billing.pass",
      { amount: 3 },
      { actor, idempotencyKey: "😀".repeat(200) },
    );
    assert.equal(emoji.status, "succeeded");
  });

  test("a handler's grant verifies offline with the plane's published keys", async () => {
    const envelope = await rt.invoke("billing.pass", { amount: 3 }, { actor });
    assert.deepEqual(unwrap(envelope), { actor: "bot-7", capability: "billing.pass" });
  });

  test("a plane that cannot be reached fails closed, retrying a read but not a write", async () => {
    const away = service("127.0.0.1:9");
    const write = await away.invoke("billing.pay", { amount: 1 }, { actor, retry: fast });
    assert.equal(failure(write)?.code, "GOVERNANCE_UNAVAILABLE");
    assert.equal(failure(write)?.retryable, true);
    assert.equal(write.attempt, 1);
    const read = await away.invoke("billing.look", { amount: 1 }, { actor, retry: fast });
    assert.equal(failure(read)?.code, "GOVERNANCE_UNAVAILABLE");
    assert.equal(read.attempt, 3);
    const keyed = await away.invoke(
      "billing.pay",
      { amount: 1 },
      {
        actor,
        retry: fast,
        idempotencyKey: "k-away",
      },
    );
    assert.equal(keyed.attempt, 3);
    assert.equal(ran.look, undefined);
    // Discovery (and so the adapters' tool lists) fails closed the same way.
    await assert.rejects(
      service("127.0.0.1:9").discover({ actor }),
      (error: unknown) =>
        error instanceof CapabilityError &&
        error.code === "GOVERNANCE_UNAVAILABLE" &&
        error.retryable === true,
    );
    await assert.rejects(
      new Runtime(target, { service: "billing", token: "not-the-token" })
        .capability({ id: "billing.nothing", input: amountIn, output: object }, () => ({}))
        .discover({ actor }),
      (error: unknown) =>
        error instanceof CapabilityError &&
        error.code === "GOVERNANCE_UNAVAILABLE" &&
        error.retryable === false,
    );
  });

  test("more capabilities than one Register call takes are registered in several", async () => {
    const many = new Runtime(target, { service: "billing", token });
    for (let n = 0; n < 150; n++) {
      many.capability({ id: `billing.many${n}`, input: object, output: object }, () => ({}));
    }
    const registered = await many.register();
    assert.equal(registered.length, 150);
    assert.deepEqual(
      new Set(registered.map((r) => r.id)),
      new Set(Array.from({ length: 150 }, (_, n) => `billing.many${n}`)),
    );
  });

  test("a runtime cannot register in a namespace its service does not own (SI-7)", async () => {
    const intruder = new Runtime(target, { service: "billing", token });
    intruder.capability({ id: "orders.sneak", input: object, output: object }, () => ({}));
    await assert.rejects(intruder.register(), (error: unknown) => {
      assert.ok(error instanceof WardenError);
      assert.match(error.message, /PERMISSION_DENIED/);
      return true;
    });
  });

  test("calls made together are each reported, with their reports sent together", async () => {
    // The plane's side (each outcome recorded, few report calls) is checked by
    // tests/integration/test_typescript_sdk.py. A runtime of its own waits
    // for the plane longer than the others: on a busy machine, a hundred
    // Begins at once can take more than their 2 s, and a Begin given up on
    // is retried, its late grant closed out as cancelled (one record more).
    const patient = service(target, 30_000);
    const before = ran.look ?? 0;
    const envelopes = await Promise.all(
      Array.from({ length: TOGETHER }, (_, i) =>
        patient.invoke("billing.look", { amount: i }, { actor }),
      ),
    );
    const said = envelopes.map((e) => (e.error ? `${e.status} ${e.error.message}` : e.status));
    assert.deepEqual(said, Array(TOGETHER).fill("succeeded"));
    assert.equal((ran.look ?? 0) - before, TOGETHER);
  });

  test("a Governor answer names the process of the plane that gave it", async () => {
    // What the runtime's balancer reads to count calls by process.
    const governor = createClient(Governor, createGrpcTransport({ baseUrl: `http://${target}` }));
    const named: string[] = [];
    for (let i = 0; i < 2; i++) {
      await governor.begin(
        {
          invocationId: uuid7(),
          capabilityId: "billing.nowhere",
          actorToken: actor,
          inputJson: "{}",
        },
        {
          headers: { "x-warden-service-token": token },
          onTrailer: (trailers) => named.push(trailers.get("x-warden-process") ?? ""),
        },
      );
    }
    assert.equal(named.length, 2);
    assert.match(named[0] ?? "", /^[0-9a-f]{12}$/);
    assert.equal(named[1], named[0]);
  });
});
