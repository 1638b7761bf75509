/**
 * The Runtime: register capabilities, and invoke them under governance.
 *
 * `invoke` runs a call as one or more attempts: each asks the plane for the
 * pre-execution stages (`Begin`), runs the handler here within its time
 * budget, classifies what it threw, validates its output and reports the
 * outcome (`Complete`). A failed attempt is retried only when that is honest
 * (SI-11). Governed failures come back as envelopes, never as exceptions.
 */

import type { MessageInitShape } from "@bufbuild/protobuf";
import { canonicalJson, compactJson, parseJson } from "./canonical.js";
import {
  buildSpec,
  type CapabilityOptions,
  type CapabilitySpec,
  type Context,
  type DiscoveredCapability,
  declaredErrors,
  discovered,
  type Handler,
  type Surface,
} from "./capability.js";
import {
  type Cancelled,
  type Envelope,
  type Failed,
  failed,
  succeeded,
  suspended,
} from "./envelope.js";
import { CapabilityError, type Json, type JsonObject, WardenError } from "./errors.js";
import type { Failure } from "./gen/warden/v1/errors_pb.js";
import {
  type CompleteRequestSchema,
  type Grant,
  OutcomeStatus,
  type Replay,
} from "./gen/warden/v1/governor_pb.js";
import type { GrantKey } from "./grants.js";
import { uuid7 } from "./ids.js";
import { Reports } from "./reports.js";
import { DEFAULT_RETRY, delayMs, mayRetry, type RetryPolicy, waitsTooLong } from "./retry.js";
import {
  type Schema,
  scrubJson,
  scrubText,
  sensitiveTexts,
  stripModelHidden,
  unechoed,
  valueTexts,
} from "./schema.js";
import { pointer } from "./standard-schema.js";
import { PlaneRefusedError, Transport } from "./transport.js";

/** Pauses between tries of an outcome report the plane could not take. */
const REPORT_RETRY_PAUSES_MS = [50, 200, 1000];

export interface RuntimeOptions {
  /** The service's name, as configured in the plane. */
  service: string;
  /** The service's token (from the environment or a secret store). */
  token: string;
  /** How long to wait for the plane before failing closed with GOVERNANCE_UNAVAILABLE. */
  governanceTimeoutMs?: number;
  /** How calls retry by default; `NO_RETRY` turns automatic retries off. */
  retry?: RetryPolicy;
}

export interface InvokeOptions {
  /** The actor's JWT. */
  actor: string | null;
  /** Attributes for policies (`context` in CEL). */
  context?: JsonObject;
  /** `direct` (the default), `mcp` or `openai`. */
  surface?: Surface;
  /** Resume a suspended call with this approval. */
  approvalId?: string;
  /** Deduplicates repeats of one call: the handler runs at most once (SPEC §8). */
  idempotencyKey?: string;
  /** A time budget for the handler; the capability's applies when this one is longer. */
  timeoutMs?: number;
  /** How this call retries; whether it retries is not configurable (`mayRetry`). */
  retry?: RetryPolicy;
  /** Cancels the call: the answer is an envelope with status `cancelled`. */
  signal?: AbortSignal;
}

/** What the plane recorded for one of this runtime's capabilities. */
export interface RegisteredCapability {
  readonly id: string;
  readonly version: string;
  readonly digest: string;
}

interface Call {
  readonly capabilityId: string;
  readonly inputJson: string;
  readonly actor: string;
  readonly contextJson: string;
  readonly surface: string;
  readonly approvalId: string;
  readonly idempotencyKey: string;
  readonly timeoutMs: number;
  readonly retry: RetryPolicy;
  readonly callId: string;
  readonly signal: AbortSignal | undefined;
}

/** What one granted attempt knows while it runs. */
interface Granted {
  readonly invocationId: string;
  readonly token: string;
  readonly spec: CapabilitySpec | undefined;
  readonly started: number;
  secrets: Set<string>;
}

interface Reported {
  error: CapabilityError | null;
  executed?: boolean;
  outputJson?: Json;
  output?: unknown;
}

/** Capabilities sent in one Register call: the plane's default limit. */
export const REGISTER_AT_ONCE = 100;
/** The longest idempotency key a `Begin` may carry, in characters (the plane's limit). */
export const MAX_IDEMPOTENCY_KEY = 255;

/** A service's connection to the plane and the capabilities it serves. */
export class Runtime {
  readonly target: string;
  readonly service: string;
  readonly retry: RetryPolicy;
  private readonly transport: Transport;
  private readonly reports: Reports;
  private readonly specs = new Map<string, CapabilitySpec>();
  private versions = new Map<string, string>();
  private registered = false;

  /**
   * @param target The plane's `host:port`.
   */
  constructor(target: string, options: RuntimeOptions) {
    this.target = target;
    this.service = options.service;
    this.retry = options.retry ?? DEFAULT_RETRY;
    this.transport = new Transport(target, options.token, options.governanceTimeoutMs ?? 5_000);
    this.reports = new Reports(this.transport);
  }

  /**
   * Declare a capability served by `handler`, which receives the input (parsed
   * by the input validator when one is given) and a `Context`, and returns
   * the output.
   *
   * @throws WardenError the definition is unusable, or the id is taken here.
   */
  capability<I = Json, O = Json, E extends string = never>(
    options: CapabilityOptions<I, O, E>,
    handler: Handler<I, O, E>,
  ): this {
    if (this.specs.has(options.id)) {
      throw new WardenError(`capability ${options.id} is already defined on this runtime`);
    }
    this.specs.set(options.id, buildSpec(options, handler));
    this.registered = false;
    return this;
  }

  /** The capabilities this runtime serves, by id. */
  get capabilities(): ReadonlyMap<string, CapabilitySpec> {
    return new Map(this.specs);
  }

  /**
   * Register every capability of this runtime with the plane (the first
   * invoke does it too).
   *
   * @throws WardenError the plane refused (the message says why) or is unreachable.
   */
  /**
   * Close the runtime's connections to the plane (connect-node would keep
   * them open for 15 minutes after the runtime is dropped). Await the calls in
   * flight first: one made after fails closed with GOVERNANCE_UNAVAILABLE.
   */
  close(): void {
    this.transport.close();
  }

  async register(): Promise<RegisteredCapability[]> {
    if (this.specs.size === 0) {
      throw new WardenError("no capabilities to register: declare them with capability() first");
    }
    // A plane takes at most 100 per call by default ([limits]
    // max_capabilities_per_register); each call registers all or nothing.
    const definitions = [...this.specs.values()].map((s) => s.definition);
    const answered = [];
    for (let start = 0; start < definitions.length; start += REGISTER_AT_ONCE) {
      answered.push(
        ...(await this.transport.register(definitions.slice(start, start + REGISTER_AT_ONCE))),
      );
    }
    const registered = answered.map((c) => ({
      id: c.definition?.id ?? "",
      version: c.definition?.version ?? "",
      digest: c.digest,
    }));
    this.versions = new Map(registered.map((r) => [r.id, r.version]));
    this.registered = true;
    return registered;
  }

  /**
   * The capabilities an actor may see on a surface, this service's and every
   * other's: unexposed and hidden ones are simply absent (SI-8).
   *
   * @throws CapabilityError UNAUTHENTICATED when the plane refused the actor,
   *   GOVERNANCE_UNAVAILABLE when it could not be asked.
   */
  async discover(options: {
    actor: string | null;
    surface?: Surface;
    context?: JsonObject;
  }): Promise<DiscoveredCapability[]> {
    try {
      await this.ensureRegistered();
    } catch (error) {
      // As for a governed call: the plane could not be asked (down, or it
      // refused this service's registration); the cause says which.
      throw new CapabilityError("GOVERNANCE_UNAVAILABLE", undefined, {
        retryable: error instanceof WardenError && error.transient,
        cause: error,
      });
    }
    const found = await this.transport.listCapabilities(
      options.actor ?? "",
      options.surface ?? "direct",
      contextJson(options.context),
    );
    return found.map(discovered);
  }

  /** The plane's published grant keys, for `verifyGrant`. */
  grantKeys(): Promise<GrantKey[]> {
    return this.transport.grantKeys();
  }

  /**
   * Invoke a capability for an actor under governance.
   *
   * @param input The arguments: a JSON value, or JSON text exactly as a model
   *   wrote it (text that is not JSON reaches the plane, which records the
   *   attempt and answers INPUT_INVALID at stage `adapter`).
   * @returns An envelope; governed failures are values, never thrown.
   * @throws WardenError `timeoutMs` is not positive, or `idempotencyKey` is
   *   longer than the plane takes (255 characters).
   */
  async invoke<O = unknown>(
    capabilityId: string,
    input: unknown,
    options: InvokeOptions,
  ): Promise<Envelope<O>> {
    if (options.timeoutMs !== undefined && !(options.timeoutMs > 0)) {
      throw new WardenError("timeoutMs must be positive");
    }
    const keyLength = [...(options.idempotencyKey ?? "")].length; // characters, as the plane counts
    if (keyLength > MAX_IDEMPOTENCY_KEY) {
      throw new WardenError(
        `idempotencyKey is longer than ${MAX_IDEMPOTENCY_KEY} characters (${keyLength})`,
      );
    }
    const call: Call = {
      capabilityId,
      inputJson: encodeInput(input),
      actor: options.actor ?? "",
      contextJson: contextJson(options.context),
      surface: options.surface ?? "direct",
      approvalId: options.approvalId ?? "",
      idempotencyKey: options.idempotencyKey ?? "",
      timeoutMs: options.timeoutMs ?? 0,
      retry: options.retry ?? this.retry,
      callId: uuid7(),
      signal: options.signal,
    };
    return (await this.call(call)) as Envelope<O>;
  }

  /** Attempts until one answers for good, or retrying is no longer honest. */
  private async call(call: Call): Promise<Envelope> {
    const spec = this.specs.get(call.capabilityId);
    for (let attempt = 1; ; attempt++) {
      if (call.signal?.aborted) {
        return stamp(failed(uuid7(), new CapabilityError("CANCELLED")), call, attempt);
      }
      const envelope = stamp(await this.attempt(call, attempt), call, attempt);
      if (
        call.signal?.aborted ||
        attempt >= call.retry.maxAttempts ||
        !mayRetry(envelope, spec?.sideEffect ?? null, call.idempotencyKey) ||
        waitsTooLong(call.retry, envelope) ||
        // A resume that was granted consumed its approval: no retry can present
        // it again. Only a failure before any grant (stage policy) is retried.
        (Boolean(call.approvalId) && envelope.error?.stage !== "policy")
      ) {
        return envelope;
      }
      if (!(await pause(delayMs(call.retry, attempt, envelope), call.signal))) {
        return {
          ...failed(envelope.invocationId, new CapabilityError("CANCELLED")),
          callId: call.callId,
          attempt,
        };
      }
    }
  }

  private async attempt(call: Call, attempt: number): Promise<Envelope> {
    const invocationId = uuid7();
    try {
      await this.ensureRegistered();
    } catch (error) {
      const transient = error instanceof WardenError && error.transient;
      return failed(
        invocationId,
        new CapabilityError("GOVERNANCE_UNAVAILABLE", undefined, {
          retryable: transient,
          cause: error,
        }),
      );
    }
    const spec = this.specs.get(call.capabilityId);
    const begin = this.transport.begin({
      invocationId,
      capabilityId: call.capabilityId,
      capabilityVersion: this.versions.get(call.capabilityId) ?? "",
      actorToken: call.actor,
      inputJson: call.inputJson,
      surface: call.surface,
      contextJson: call.contextJson,
      approvalId: call.approvalId,
      idempotencyKey: call.idempotencyKey,
      callId: call.callId,
      attempt,
      timeoutMs: call.timeoutMs,
    });
    const first = await Promise.race([
      begin.then(
        (response) => ({ response }),
        (error: unknown) => ({ error }),
      ),
      aborted(call.signal),
    ]);
    if (first === ABORTED) return this.cancelledDuringBegin(spec, invocationId, begin);
    if ("error" in first) {
      return failed(invocationId, asCapabilityError(first.error));
    }
    const outcome = first.response.outcome;
    switch (outcome.case) {
      case "failure":
        return failed(invocationId, errorFromProto(outcome.value));
      case "suspension":
        return suspended(
          invocationId,
          errorFromProto(outcome.value.failure),
          outcome.value.approvalId,
        );
      case "replay":
        return replayed(spec, invocationId, outcome.value);
      case "grant": {
        const granted: Granted = {
          invocationId,
          token: outcome.value.token,
          spec,
          started: performance.now(),
          secrets: new Set(),
        };
        if (spec === undefined) {
          const cause = new WardenError(`no handler for ${call.capabilityId} here`);
          return this.report(granted, {
            error: new CapabilityError("INTERNAL_ERROR", undefined, { cause }),
          });
        }
        return this.execute(granted, spec, outcome.value, call.signal);
      }
      default:
        return failed(
          invocationId,
          new CapabilityError("GOVERNANCE_UNAVAILABLE", undefined, {
            cause: new WardenError("the plane answered Begin with no outcome"),
          }),
        );
    }
  }

  /**
   * The plane may grant all the same: wait for its answer and close a grant
   * out as cancelled, so that it is audited and an idempotency key it
   * reserved is released rather than left running.
   */
  private async cancelledDuringBegin(
    spec: CapabilitySpec | undefined,
    invocationId: string,
    begin: ReturnType<Transport["begin"]>,
  ): Promise<Envelope> {
    const cancelled = new CapabilityError("CANCELLED");
    let response: Awaited<typeof begin>;
    try {
      response = await begin;
    } catch {
      return failed(invocationId, cancelled);
    }
    if (response.outcome.case === "grant") {
      const granted: Granted = {
        invocationId,
        token: response.outcome.value.token,
        spec,
        started: performance.now(),
        secrets: new Set(),
      };
      return this.report(granted, { error: cancelled });
    }
    return failed(invocationId, cancelled);
  }

  private async execute(
    granted: Granted,
    spec: CapabilitySpec,
    grant: Grant,
    signal: AbortSignal | undefined,
  ): Promise<Envelope> {
    let input: unknown;
    try {
      const raw = parseJson(grant.inputJson);
      granted.secrets = sensitiveTexts(raw, spec.inputSchema);
      input = raw;
      if (spec.inputValidator) {
        const result = await spec.inputValidator["~standard"].validate(raw);
        if (result.issues) {
          // Each path, and its message unless that repeats a value of the input;
          // the validator's whole text stays in the private cause.
          const echoes = valueTexts(raw);
          const issues = result.issues
            .map((issue) => ({ path: pointer(issue), message: unechoed(issue.message, echoes) }))
            .sort((a, b) => (a.path + a.message < b.path + b.message ? -1 : 1));
          const cause = new Error(
            result.issues.map((issue) => `${pointer(issue)}: ${issue.message}`).join("; "),
          );
          const error = new CapabilityError("INPUT_INVALID", undefined, {
            details: { issues },
            cause,
          });
          return this.report(granted, { error });
        }
        input = result.value;
      }
    } catch (cause) {
      const error = new CapabilityError("INPUT_INVALID", undefined, {
        details: { issues: [] },
        cause,
      });
      return this.report(granted, { error });
    }
    const handlerAbort = new AbortController();
    const actorAttrs = grant.actor?.attrsJson
      ? (JSON.parse(grant.actor.attrsJson) as Record<string, Json>)
      : {};
    const ctx: Context<string> = {
      actor: {
        id: grant.actor?.id ?? "",
        roles: [...(grant.actor?.roles ?? [])],
        tenant: grant.actor?.tenant ?? "",
        attrs: actorAttrs,
      },
      invocationId: granted.invocationId,
      capabilityId: spec.id,
      errors: declaredErrors(spec.errors),
      grantToken: grant.token,
      signal: handlerAbort.signal,
    };
    // The plane granted the budget that applies: the capability's, or the
    // caller's when that is shorter.
    const budget = grant.timeoutMs > 0 ? grant.timeoutMs : null;
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<typeof TIMED_OUT>((resolve) => {
      if (budget !== null) timer = setTimeout(() => resolve(TIMED_OUT), budget);
    });
    const running = (async () => spec.handler(input, ctx))().then(
      (value) => ({ value }),
      (thrown: unknown) => ({ thrown }),
    );
    const settled = await Promise.race([running, timedOut, aborted(signal)]);
    clearTimeout(timer);
    if (settled === TIMED_OUT) {
      handlerAbort.abort(new Error("the time budget ran out"));
      return this.report(granted, { error: new CapabilityError("TIMEOUT"), executed: true });
    }
    if (settled === ABORTED) {
      handlerAbort.abort(new Error("the caller cancelled"));
      return this.report(granted, { error: new CapabilityError("CANCELLED"), executed: true });
    }
    if ("thrown" in settled) {
      const thrown = settled.thrown;
      if (
        thrown instanceof CapabilityError &&
        spec.errors.has(thrown.code) &&
        thrown.exposeToModel &&
        isRecordable(thrown.details)
      ) {
        return this.report(granted, { error: thrown });
      }
      // Undeclared, or details the audit log cannot hold: concealed.
      const error = new CapabilityError("INTERNAL_ERROR", undefined, { cause: thrown });
      return this.report(granted, { error, executed: true });
    }
    const checked = await checkedOutput(spec, settled.value, granted);
    if (checked instanceof CapabilityError) {
      return this.report(granted, { error: checked, executed: true });
    }
    return this.report(granted, { error: null, outputJson: checked.json, output: checked.output });
  }

  /** Step 14: report the outcome, then answer with the envelope. */
  private async report(granted: Granted, outcome: Reported): Promise<Envelope> {
    const { error } = outcome;
    const executed = Boolean(outcome.executed) && error !== null;
    const request: MessageInitShape<typeof CompleteRequestSchema> = {
      invocationId: granted.invocationId,
      grantToken: granted.token,
      executedBeforeFailure: executed,
      durationMs: Math.round(performance.now() - granted.started),
    };
    if (error === null) {
      // In clear: the plane redacts what it stores, and seals what it keeps for replay.
      request.status = OutcomeStatus.SUCCEEDED;
      request.outputJson = compactJson(outcome.outputJson ?? null);
    } else {
      if (error.details && granted.secrets.size > 0) {
        error.details = scrubJson(error.details, granted.secrets) as JsonObject;
      }
      request.status = error.code === "CANCELLED" ? OutcomeStatus.CANCELLED : OutcomeStatus.FAILED;
      request.failure = errorToProto(error);
      request.diagnostics = diagnostics(error.cause, granted.secrets);
    }
    await this.reportOutcome(request);
    if (error === null) {
      const spec = granted.spec;
      const json = outcome.outputJson ?? null;
      const modelOutput = spec ? stripModelHidden(json, spec.outputSchema) : json;
      return succeeded(granted.invocationId, outcome.output, modelOutput);
    }
    return failed(granted.invocationId, error, executed);
  }

  /**
   * Report an outcome, trying again while the plane is briefly away: losing
   * it would leave the audit log a decision without an ending. The plane
   * refuses a second report of one invocation (ALREADY_EXISTS), which means
   * an earlier try arrived.
   */
  private async reportOutcome(
    request: MessageInitShape<typeof CompleteRequestSchema>,
  ): Promise<void> {
    for (const pauseMs of [...REPORT_RETRY_PAUSES_MS, null]) {
      try {
        await this.reports.send(request);
        return;
      } catch (thrown) {
        const error = asCapabilityError(thrown);
        const cause = error.cause;
        if (cause instanceof PlaneRefusedError && cause.status === "ALREADY_EXISTS") return;
        if (!error.retryable || pauseMs === null) {
          process.emitWarning(
            `the outcome of invocation ${request.invocationId} could not be reported: ${String(cause)}`,
            "WardenWarning",
          );
          return;
        }
      }
      await pause(pauseMs, undefined);
    }
  }

  private async ensureRegistered(): Promise<void> {
    if (!this.registered && this.specs.size > 0) await this.register();
  }
}

const ABORTED = Symbol("aborted");
const TIMED_OUT = Symbol("timed out");

/** Settles with ABORTED when `signal` aborts; never settles without one. */
function aborted(signal: AbortSignal | undefined): Promise<typeof ABORTED> {
  return new Promise((resolve) => {
    if (signal === undefined) return;
    if (signal.aborted) resolve(ABORTED);
    else signal.addEventListener("abort", () => resolve(ABORTED), { once: true });
  });
}

/** Wait `ms`; false when `signal` aborted first. */
async function pause(ms: number, signal: AbortSignal | undefined): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const slept = new Promise<true>((resolve) => {
    timer = setTimeout(() => resolve(true), ms);
  });
  const result = await Promise.race([slept, aborted(signal)]);
  clearTimeout(timer);
  return result === true;
}

function stamp(envelope: Envelope, call: Call, attempt: number): Envelope {
  return { ...envelope, callId: call.callId, attempt };
}

/**
 * The caller's context as JSON text, or the caller's mistake: NaN or Infinity
 * (which JSON.stringify writes as null) or a BigInt (which it throws on) is
 * no JSON, and would read as a policy input nobody gave.
 */
function contextJson(context: JsonObject | undefined): string {
  if (!isJson(context ?? {})) {
    throw new WardenError("context is not JSON: no NaN, Infinity, BigInt or class instances");
  }
  return compactJson(context ?? {});
}

function encodeInput(value: unknown): string {
  if (typeof value === "string") return value;
  // Not JSON (JSON.stringify would write NaN and Infinity, which a model's
  // 1e400 parses to, as null): the plane answers INPUT_INVALID at stage
  // adapter, and records it, as it does for the Python SDK.
  if (holdsNonFinite(value, 0)) return "";
  try {
    return JSON.stringify(value) ?? "";
  } catch {
    return "";
  }
}

function holdsNonFinite(value: unknown, depth: number): boolean {
  if (typeof value === "number") return !Number.isFinite(value);
  if (depth > 64 || value === null || typeof value !== "object") return false;
  const children = Array.isArray(value) ? value : Object.values(value);
  return children.some((child) => holdsNonFinite(child, depth + 1));
}

function asCapabilityError(thrown: unknown): CapabilityError {
  return thrown instanceof CapabilityError
    ? thrown
    : new CapabilityError("INTERNAL_ERROR", undefined, { cause: thrown });
}

export function errorFromProto(failure: Failure | undefined): CapabilityError {
  const details = failure?.detailsJson ? (JSON.parse(failure.detailsJson) as JsonObject) : null;
  return new CapabilityError(failure?.code ?? "INTERNAL_ERROR", failure?.publicMessage, {
    stage: failure?.stage ?? "",
    retryable: failure?.retryable ?? false,
    exposeToModel: failure?.exposed ?? false,
    details,
  });
}

function errorToProto(error: CapabilityError): Omit<Failure, "$typeName"> {
  return {
    code: error.code,
    stage: error.stage,
    publicMessage: error.publicMessage,
    retryable: error.retryable,
    exposed: error.exposeToModel,
    detailsJson: error.details ? compactJson(error.details) : "",
  };
}

/**
 * The private body of a failure, with every sensitive value masked: an
 * exception message is a classic way for a card number to reach a log.
 */
function diagnostics(cause: unknown, secrets: Set<string>) {
  if (cause === undefined || cause === null) return { causeType: "", causeMessage: "", stack: "" };
  const error = cause instanceof Error ? cause : new Error(String(cause));
  return {
    causeType: error.name || error.constructor.name,
    causeMessage: scrubText(error.message, secrets),
    stack: scrubText(error.stack ?? "", secrets),
  };
}

/** The recorded outcome of the call that holds the idempotency key. */
function replayed(
  spec: CapabilitySpec | undefined,
  invocationId: string,
  replay: Replay,
): Envelope {
  const original = replay.originalInvocationId;
  if (replay.status !== OutcomeStatus.SUCCEEDED) {
    const envelope: Failed | Cancelled = failed(
      invocationId,
      errorFromProto(replay.failure),
      replay.executedBeforeFailure,
    );
    return { ...envelope, replayedFrom: original };
  }
  const value = JSON.parse(replay.outputJson) as Json;
  // A runtime that does not serve the capability cannot know which fields are
  // model-hidden: it offers the model nothing (SI-5), as the Python SDK does.
  const modelOutput = spec ? stripModelHidden(value, spec.outputSchema) : null;
  return { ...succeeded(invocationId, value, modelOutput), replayedFrom: original };
}

/** The handler's output, checked against its schema; OUTPUT_INVALID when it is not. */
async function checkedOutput(
  spec: CapabilitySpec,
  result: unknown,
  granted: Granted,
): Promise<{ json: Json; output: unknown } | CapabilityError> {
  const invalid = (problem: string) =>
    new CapabilityError("OUTPUT_INVALID", undefined, { cause: new Error(problem) });
  if (!isJson(result)) return invalid("output is not JSON");
  for (const text of sensitiveTexts(result, spec.outputSchema)) granted.secrets.add(text);
  const issues = spec.validateOutput(result);
  if (issues.length > 0) {
    return invalid(
      `output does not match its schema: ${issues.map((i) => `${i.path || "/"} ${i.message}`).join("; ")}`,
    );
  }
  let output: unknown = result;
  if (spec.outputValidator) {
    const parsed = await spec.outputValidator["~standard"].validate(result);
    if (parsed.issues) {
      return invalid(`output does not match its validator: ${parsed.issues.length} issues`);
    }
    output = parsed.value;
  }
  return { json: result, output };
}

/** The largest declared error details a plane records by default (`[limits] max_context_bytes`). */
const MAX_DETAILS_BYTES = 64 * 1024;

/**
 * Whether the plane records a declared error's details as they are: a JSON
 * object as every reader takes it (no NaN or infinity, nothing but JSON's own
 * kinds, integers within ±(2^53 - 1), well-formed text, nested at most 64
 * deep) of at most `MAX_DETAILS_BYTES`. A model must not be shown what the
 * audit log cannot hold: the plane would refuse the report.
 */
function isRecordable(details: unknown): boolean {
  if (details === null || details === undefined) return true;
  if (!isJson(details) || typeof details !== "object" || Array.isArray(details)) return false;
  try {
    canonicalJson(details);
    const text = compactJson(details);
    parseJson(text); // an integer beyond ±(2^53 - 1) is written as one the plane refuses
    return Buffer.byteLength(text, "utf8") <= MAX_DETAILS_BYTES;
  } catch {
    return false;
  }
}

function isJson(value: unknown, depth = 0): value is Json {
  if (depth > 64) return false;
  if (value === null || typeof value === "string" || typeof value === "boolean") return true;
  if (typeof value === "number") return Number.isFinite(value);
  if (Array.isArray(value)) return value.every((item) => isJson(item, depth + 1));
  if (typeof value === "object" && Object.getPrototypeOf(value) === Object.prototype) {
    return Object.values(value).every((item) => isJson(item, depth + 1));
  }
  return false;
}

export type { Schema };
