/** A capability as the SDK holds it: the handler, its schemas, its definition. */

import { create } from "@bufbuild/protobuf";
import { compactJson } from "./canonical.js";
import { CapabilityError, type Json, type JsonObject, WardenError } from "./errors.js";
import {
  type Capability,
  type CapabilityDefinition,
  CapabilityDefinitionSchema,
  SideEffect as SideEffectProto,
} from "./gen/warden/v1/registry_pb.js";
import type { SideEffect } from "./retry.js";
import { compileValidator, type Schema, type Validate } from "./schema.js";
import type { StandardSchemaV1 } from "./standard-schema.js";

export const SURFACES = ["mcp", "openai", "direct"] as const;
export type Surface = (typeof SURFACES)[number];

const ID = /^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$/;
const SIDE_EFFECTS: Record<SideEffect, SideEffectProto> = {
  read: SideEffectProto.READ,
  write: SideEffectProto.WRITE,
  idempotent: SideEffectProto.IDEMPOTENT,
};

/** An error a capability declares: part of its contract, shown to models. */
export interface DeclaredError {
  readonly message: string;
  readonly retryable?: boolean;
}

/** The verified actor a call is made for (from its JWT, checked by the plane). */
export interface Actor {
  readonly id: string;
  readonly roles: readonly string[];
  readonly tenant: string;
  readonly attrs: Readonly<Record<string, Json>>;
}

/** Builds a declared error to throw: `throw ctx.errors.NOT_ELIGIBLE({ details })`. */
export type ErrorFactory = (options?: { details?: JsonObject }) => CapabilityError;

/** Handed to every handler. */
export interface Context<E extends string = string> {
  readonly actor: Actor;
  /** This attempt's id (it is in the audit log). */
  readonly invocationId: string;
  readonly capabilityId: string;
  /** The capability's declared errors. */
  readonly errors: Readonly<Record<E, ErrorFactory>>;
  /** The plane's signed grant; a downstream service checks it with `verifyGrant`. */
  readonly grantToken: string;
  /** Aborted when the time budget runs out or the caller cancels: pass it to your I/O. */
  readonly signal: AbortSignal;
}

export type Handler<I, O, E extends string> = (input: I, ctx: Context<E>) => O | Promise<O>;

/** The definition fields of SPEC §5, in TypeScript's spelling. */
export interface CapabilityOptions<I, O, E extends string> {
  /** `namespace.name`, lowercase, dot separated, e.g. `orders.refund`. */
  id: string;
  /** JSON Schema 2020-12 of the input: registered, and checked by the plane. */
  input: Schema;
  /** JSON Schema 2020-12 of the output: registered, and checked here before anyone sees it. */
  output: Schema;
  /**
   * Standard Schema validators (Zod, Valibot, ...) that also parse input and
   * output into their types; the JSON Schemas above stay the contract.
   */
  validators?: { input?: StandardSchemaV1<unknown, I>; output?: StandardSchemaV1<unknown, O> };
  /** `write` (the default, which never retries on its own), `read` or `idempotent`. */
  sideEffect?: SideEffect;
  /** Declared errors: code -> message, or `{ message, retryable }`. */
  errors?: Readonly<Record<E, string | DeclaredError>>;
  timeoutMs?: number;
  /** Surfaces it may be called on; all by default. */
  exposure?: readonly Surface[];
  requiredRoles?: readonly string[];
  tags?: readonly string[];
  description?: string;
  /** The plane numbers versions when unset: a changed schema becomes the next one. */
  version?: string;
}

/** A capability registered with a Runtime. */
export interface CapabilitySpec {
  readonly id: string;
  readonly handler: Handler<unknown, unknown, string>;
  readonly sideEffect: SideEffect;
  readonly errors: ReadonlyMap<string, Required<DeclaredError>>;
  readonly inputSchema: Schema;
  readonly outputSchema: Schema;
  readonly validateOutput: Validate;
  readonly inputValidator: StandardSchemaV1 | undefined;
  readonly outputValidator: StandardSchemaV1 | undefined;
  readonly definition: CapabilityDefinition;
}

/**
 * Check a definition and compile its output schema.
 *
 * @throws WardenError the definition is unusable (the message says why).
 */
export function buildSpec<I, O, E extends string>(
  options: CapabilityOptions<I, O, E>,
  handler: Handler<I, O, E>,
): CapabilitySpec {
  const where = `capability ${JSON.stringify(options.id)}`;
  if (!ID.test(options.id)) {
    throw new WardenError(`${where}: id must be namespace.name, lowercase, dot separated`);
  }
  const sideEffect = options.sideEffect ?? "write";
  if (!(sideEffect in SIDE_EFFECTS)) {
    throw new WardenError(`${where}: sideEffect must be read, write or idempotent`);
  }
  const exposure = options.exposure ?? SURFACES;
  const unknown = exposure.filter((s) => !SURFACES.includes(s));
  if (unknown.length > 0) {
    throw new WardenError(`${where}: unknown surfaces ${unknown.join(", ")}`);
  }
  if (options.timeoutMs !== undefined && !(options.timeoutMs > 0)) {
    throw new WardenError(`${where}: timeoutMs must be positive`);
  }
  let validateOutput: Validate;
  try {
    compileValidator(options.input);
    validateOutput = compileValidator(options.output);
  } catch (error) {
    throw new WardenError(`${where}: invalid JSON Schema: ${(error as Error).message}`);
  }
  const errors = new Map<string, Required<DeclaredError>>();
  for (const [code, spec] of Object.entries<string | DeclaredError>(options.errors ?? {})) {
    if (!/^[A-Z][A-Z0-9_]*$/.test(code)) {
      throw new WardenError(`${where}: error code ${code} must be UPPER_SNAKE_CASE`);
    }
    const declared = typeof spec === "string" ? { message: spec } : spec;
    errors.set(code, { message: declared.message, retryable: declared.retryable ?? false });
  }
  const definition = create(CapabilityDefinitionSchema, {
    id: options.id,
    version: options.version ?? "",
    description: options.description ?? "",
    inputSchemaJson: compactJson(options.input),
    outputSchemaJson: compactJson(options.output),
    errors: [...errors].map(([code, e]) => ({ code, ...e })),
    sideEffect: SIDE_EFFECTS[sideEffect],
    timeoutMs: options.timeoutMs ?? 0,
    exposure: [...exposure],
    requiredRoles: [...(options.requiredRoles ?? [])],
    tags: [...(options.tags ?? [])],
  });
  return {
    id: options.id,
    handler: handler as Handler<unknown, unknown, string>,
    sideEffect,
    errors,
    inputSchema: options.input,
    outputSchema: options.output,
    validateOutput,
    inputValidator: options.validators?.input,
    outputValidator: options.validators?.output,
    definition,
  };
}

/** Factories for a capability's declared errors. */
export function declaredErrors(
  errors: ReadonlyMap<string, Required<DeclaredError>>,
): Record<string, ErrorFactory> {
  const out: Record<string, ErrorFactory> = {};
  for (const [code, declared] of errors) {
    out[code] = (options = {}) =>
      new CapabilityError(code, declared.message, {
        stage: "execution",
        retryable: declared.retryable,
        exposeToModel: true,
        details: options.details ?? null,
      });
  }
  return out;
}

/** A capability as discovery shows it to an actor on a surface. */
export interface DiscoveredCapability {
  readonly id: string;
  readonly version: string;
  readonly service: string;
  readonly description: string;
  readonly inputSchema: Schema;
  readonly outputSchema: Schema;
  readonly sideEffect: SideEffect;
  readonly tags: readonly string[];
}

const SIDE_EFFECT_NAMES = new Map<SideEffectProto, SideEffect>([
  [SideEffectProto.READ, "read"],
  [SideEffectProto.WRITE, "write"],
  [SideEffectProto.IDEMPOTENT, "idempotent"],
]);

export function discovered(capability: Capability): DiscoveredCapability {
  const d = capability.definition;
  return {
    id: d?.id ?? "",
    version: d?.version ?? "",
    service: capability.service,
    description: d?.description ?? "",
    inputSchema: d?.inputSchemaJson ? (JSON.parse(d.inputSchemaJson) as Schema) : {},
    outputSchema: d?.outputSchemaJson ? (JSON.parse(d.outputSchemaJson) as Schema) : {},
    sideEffect: SIDE_EFFECT_NAMES.get(d?.sideEffect ?? SideEffectProto.WRITE) ?? "write",
    tags: [...(d?.tags ?? [])],
  };
}
