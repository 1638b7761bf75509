/** The billing service of the cross-language test: two capabilities in TypeScript. */

import { z } from "zod";
import { Runtime } from "../../src/index.js";

const Quote = z.object({ amount: z.number().int().positive() });

export function buildBilling(target: string, token: string): Runtime {
  const rt = new Runtime(target, { service: "billing", token });
  rt.capability(
    {
      id: "billing.quote",
      description: "The fee for charging an amount.",
      input: {
        type: "object",
        properties: { amount: { type: "integer", minimum: 1 } },
        required: ["amount"],
        additionalProperties: false,
      },
      output: {
        type: "object",
        properties: { amount: { type: "integer" }, fee: { type: "integer" } },
        required: ["amount", "fee"],
      },
      validators: { input: Quote },
      sideEffect: "read",
    },
    (input) => ({ amount: input.amount, fee: Math.ceil(input.amount / 50) }),
  );
  rt.capability(
    {
      id: "billing.charge",
      description: "Charge the customer's card.",
      input: {
        type: "object",
        properties: {
          amount: { type: "integer", minimum: 1 },
          card: { type: "string", "x-warden-sensitive": true },
        },
        required: ["amount", "card"],
        additionalProperties: false,
      },
      output: {
        type: "object",
        properties: {
          charge_id: { type: "string" },
          processor_ref: { type: "string", "x-warden-model-visible": false },
        },
        required: ["charge_id", "processor_ref"],
      },
      errors: { CARD_DECLINED: "The card was declined." },
    },
    (input: { amount: number; card: string }, ctx) => {
      if (input.card.endsWith("0000")) throw ctx.errors.CARD_DECLINED();
      return { charge_id: `ch-${input.amount}`, processor_ref: "psp-42" };
    },
  );
  return rt;
}
