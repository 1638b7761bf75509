/** The billing service as an MCP server over stdio, for the actor in its environment. */

import { serveStdio } from "../../src/adapters/mcp.js";
import { buildBilling } from "./billing.js";

const env = process.env;
await serveStdio(buildBilling(env.WARDEN_TARGET ?? "", env.WARDEN_SERVICE_TOKEN ?? ""), {
  actor: env.WARDEN_ACTOR_TOKEN ?? "",
});
