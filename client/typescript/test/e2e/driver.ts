/**
 * The TypeScript side of the cross-language test: the billing service invokes
 * its own capabilities, asks for an approval and resumes once an approver has
 * acted, invokes the Python orders service's capability through its MCP
 * server (discovery, as a model would), and tries to register in the orders
 * namespace. Each step prints one JSON line; the test answers on stdin.
 */

import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { Runtime, unwrap, WardenError } from "../../src/index.js";
import { buildBilling } from "./billing.js";

const env = process.env;
const target = env.WARDEN_TARGET ?? "";
const actor = env.WARDEN_ACTOR_TOKEN ?? "";
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const say = (step: string, data: object) => console.log(JSON.stringify({ step, ...data }));

const rt = buildBilling(target, env.WARDEN_SERVICE_TOKEN ?? "");
await rt.register();

const quote = await rt.invoke("billing.quote", { amount: 40 }, { actor });
say("own", { status: quote.status, output: unwrap(quote), invocation_id: quote.invocationId });

const charge = { amount: 250, card: "4111111111111111" };
const pending = await rt.invoke("billing.charge", charge, { actor });
say("suspended", {
  status: pending.status,
  approval_id: pending.approvalId,
  model: pending.error?.toModel(),
  invocation_id: pending.invocationId,
});
await lines.next(); // the approver has acted
const resumed = await rt.invoke("billing.charge", charge, {
  actor,
  approvalId: pending.approvalId ?? "",
});
say("resumed", {
  status: resumed.status,
  output: resumed.output,
  model_output: resumed.modelOutput,
  invocation_id: resumed.invocationId,
});

const orders = new Client({ name: "billing-agent", version: "1" });
await orders.connect(
  new StdioClientTransport({
    command: env.WARDEN_PYTHON ?? "python3",
    args: [env.ORDERS_MCP_SERVER ?? ""],
    env: env as Record<string, string>,
  }),
);
const listed = await orders.listTools();
const got = await orders.callTool({ name: "orders.get", arguments: { order_id: "A1" } });
say("other", { tools: listed.tools.map((t) => t.name), result: got.structuredContent });
await orders.close();

const intruder = new Runtime(target, { service: "billing", token: env.WARDEN_SERVICE_TOKEN ?? "" });
intruder.capability(
  { id: "orders.sneak", input: { type: "object" }, output: { type: "object" } },
  () => ({}),
);
try {
  await intruder.register();
  say("si7", { registered: true });
} catch (error) {
  say("si7", { registered: false, refused: error instanceof WardenError, message: String(error) });
}
process.exit(0);
