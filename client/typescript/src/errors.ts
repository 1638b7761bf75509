/** The two-face error: a model-safe public face and a private diagnostic body. */

import { CODES, CONCEALED_CODE, CONCEALED_MESSAGE } from "./codes.js";

/** A JSON value: what crosses the wire and reaches models. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type JsonObject = { [key: string]: Json };

/** What a model may see of a failure: one of exactly two shapes (SI-9). */
export type ModelError =
  | { code: string; message: string; retryable: boolean; details?: JsonObject }
  | { code: "INTERNAL_ERROR"; message: string };

export interface CapabilityErrorOptions {
  stage?: string;
  retryable?: boolean;
  exposeToModel?: boolean;
  details?: JsonObject | null;
  cause?: unknown;
}

/**
 * A failure of a governed invocation.
 *
 * `cause` is the real error, for logs and the audit store only: it is never
 * serialized outward (`toJSON` and `toModel` leave it out).
 */
export class CapabilityError extends Error {
  override readonly name = "CapabilityError";
  /** Stable and machine-readable: a built-in code or a declared one. */
  readonly code: string;
  /** Where the pipeline failed (`discovery`, `policy`, ...). */
  readonly stage: string;
  /** Written for models and end users. */
  readonly publicMessage: string;
  /** Whether an identical request could succeed later. */
  readonly retryable: boolean;
  /** Whether code and public message may cross the adapter boundary. */
  readonly exposeToModel: boolean;
  /** Model-safe structured data, or null. */
  details: JsonObject | null;

  constructor(code: string, publicMessage?: string, options: CapabilityErrorOptions = {}) {
    const known = CODES.get(code);
    const stage = options.stage || known?.stage || "execution";
    const message = publicMessage || known?.publicMessage || CONCEALED_MESSAGE;
    super(`${code} (${stage}): ${message}`, { cause: options.cause });
    this.code = code;
    this.stage = stage;
    this.publicMessage = message;
    this.retryable = options.retryable ?? known?.retryable ?? false;
    this.exposeToModel = options.exposeToModel ?? known?.exposed ?? true;
    this.details = options.details ?? null;
  }

  /**
   * The only shapes a model ever sees (SI-9). Exposed: `{code, message,
   * retryable}` plus `details` when present. Concealed: exactly
   * `{code: "INTERNAL_ERROR", message: "The operation failed."}`.
   */
  toModel(): ModelError {
    if (!this.exposeToModel) return { code: CONCEALED_CODE, message: CONCEALED_MESSAGE };
    const shape: { code: string; message: string; retryable: boolean; details?: JsonObject } = {
      code: this.code,
      message: this.publicMessage,
      retryable: this.retryable,
    };
    if (this.details && Object.keys(this.details).length > 0) {
      shape.details = structuredClone(this.details);
    }
    return shape;
  }

  /** What `JSON.stringify` writes: the model-safe shape, never the cause. */
  toJSON(): ModelError {
    return this.toModel();
  }
}

/**
 * A developer-facing error of the SDK itself: a bad definition, a refused
 * registration, a bad argument. Never thrown for a governed invocation.
 */
export class WardenError extends Error {
  override readonly name: string = "WardenError";
  /** The plane could not be reached, so trying again may work. */
  readonly transient: boolean;

  constructor(message: string, options: { transient?: boolean } = {}) {
    super(message);
    this.transient = options.transient ?? false;
  }
}

/** The plane refused an approver's request, or could not be reached. */
export class ApprovalError extends WardenError {
  override readonly name = "ApprovalError";
  /** The gRPC status name, e.g. `PERMISSION_DENIED`. */
  readonly status: string;

  constructor(status: string, message: string, options: { transient?: boolean } = {}) {
    super(message, options);
    this.status = status;
  }
}
