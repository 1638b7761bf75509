/** Strict function-calling tools: OpenAI's strict mode rules, checked on real schemas. */

import assert from "node:assert/strict";
import { test } from "node:test";
import type { ChatCompletionTool } from "openai/resources/chat/completions";
import { definition, strictSchema } from "../src/adapters/openai.js";

const refund = {
  title: "RefundIn",
  type: "object",
  properties: {
    order_id: { type: "string", title: "Order Id" },
    amount: { type: "integer", minimum: 1 },
    note: { type: "string", default: "" },
    address: {
      type: "object",
      properties: { city: { type: "string" }, zip: { type: "string" } },
      required: ["city"],
    },
    reason: { enum: ["damaged", "late"] },
  },
  required: ["order_id", "amount"],
};

test("a strict tool closes every object and requires every property, optional ones nullable", () => {
  const tool = definition(
    {
      id: "orders.refund",
      version: "1",
      service: "orders",
      description: "Refund an order.",
      inputSchema: refund,
      outputSchema: {},
      sideEffect: "write",
      tags: [],
    },
    true,
  );
  const typed: ChatCompletionTool = tool; // the openai package's own type accepts it
  assert.equal(typed.type, "function");
  assert.equal(tool.function.strict, true);
  assert.equal(tool.function.name, "orders-refund");
  assert.deepEqual(tool.function.parameters, {
    type: "object",
    properties: {
      order_id: { type: "string" },
      amount: { type: "integer", minimum: 1 },
      note: { type: ["string", "null"] },
      address: {
        type: ["object", "null"],
        properties: { city: { type: "string" }, zip: { type: ["string", "null"] } },
        required: ["city", "zip"],
        additionalProperties: false,
      },
      reason: { anyOf: [{ enum: ["damaged", "late"] }, { type: "null" }] },
    },
    required: ["order_id", "amount", "note", "address", "reason"],
    additionalProperties: false,
  });
});

test("an object without properties is closed all the same", () => {
  assert.deepEqual(strictSchema({ type: "object" }), {
    type: "object",
    properties: {},
    required: [],
    additionalProperties: false,
  });
});
