/**
 * `@warden/sdk`: everything a Node.js service needs to declare capabilities,
 * register them with the plane, invoke them for an actor, and hand the
 * outcome to a model. Adapters: `@warden/sdk/adapters/openai` and
 * `@warden/sdk/adapters/mcp`.
 */

export { Approvals } from "./approvals.js";
export { canonicalJson, digest, NotCanonicalizable, parseJson } from "./canonical.js";
export type {
  Actor,
  CapabilityOptions,
  Context,
  DeclaredError,
  DiscoveredCapability,
  ErrorFactory,
  Handler,
  Surface,
} from "./capability.js";
export { CODES, STAGES } from "./codes.js";
export type { Cancelled, Envelope, Failed, Status, Succeeded, Suspended } from "./envelope.js";
export { unwrap } from "./envelope.js";
export type { Json, JsonObject, ModelError } from "./errors.js";
export { ApprovalError, CapabilityError, WardenError } from "./errors.js";
export type { GrantClaims, GrantKey, GrantRefusal, VerifyGrantOptions } from "./grants.js";
export { GrantVerificationError, verifyGrant } from "./grants.js";
export type { RetryPolicy, SideEffect } from "./retry.js";
export { DEFAULT_RETRY, mayRetry, NO_RETRY } from "./retry.js";
export type { InvokeOptions, RegisteredCapability, RuntimeOptions } from "./runtime.js";
export { Runtime } from "./runtime.js";
export type { Schema } from "./schema.js";
export { MODEL_VISIBLE, SENSITIVE, stripModelHidden } from "./schema.js";
export type { StandardSchemaV1 } from "./standard-schema.js";
