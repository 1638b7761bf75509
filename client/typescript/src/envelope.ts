/** Envelopes: the outcome of an invocation as a value. */

import type { CapabilityError, Json } from "./errors.js";

export type Status = "succeeded" | "failed" | "suspended" | "cancelled";

interface Common {
  /** This attempt's id, on every envelope. */
  readonly invocationId: string;
  /** The logical call: every automatic retry is an attempt of it. */
  readonly callId: string;
  /** Which attempt answered, from 1. */
  readonly attempt: number;
  /** Set when this is the recorded outcome of an earlier call with the same idempotency key. */
  readonly replayedFrom: string | null;
}

/** The handler answered and its output matched its schema. */
export interface Succeeded<O = unknown> extends Common {
  readonly status: "succeeded";
  /** The validated output. */
  readonly output: O;
  /** The output as a model may see it: without fields marked `x-warden-model-visible: false`. */
  readonly modelOutput: Json;
  readonly error: null;
  readonly approvalId: null;
  readonly executedBeforeFailure: false;
}

/** A governed failure (including `GOVERNANCE_UNAVAILABLE`, a timeout, a concealed error). */
export interface Failed extends Common {
  readonly status: "failed";
  readonly output: null;
  readonly modelOutput: null;
  readonly error: CapabilityError;
  readonly approvalId: null;
  /** The handler ran before the failure, so side effects may exist. */
  readonly executedBeforeFailure: boolean;
}

/** The call waits for a human: `error.code` is `APPROVAL_REQUIRED`. */
export interface Suspended extends Common {
  readonly status: "suspended";
  readonly output: null;
  readonly modelOutput: null;
  readonly error: CapabilityError;
  /** The pending approval; resume with `invoke(..., { approvalId })`. */
  readonly approvalId: string;
  readonly executedBeforeFailure: false;
}

/** The caller cancelled: `error.code` is `CANCELLED`. */
export interface Cancelled extends Common {
  readonly status: "cancelled";
  readonly output: null;
  readonly modelOutput: null;
  readonly error: CapabilityError;
  readonly approvalId: null;
  readonly executedBeforeFailure: boolean;
}

/** The result of `Runtime.invoke`: governed failures are values, never thrown. */
export type Envelope<O = unknown> = Succeeded<O> | Failed | Suspended | Cancelled;

/** The envelope's output, or its error thrown (`APPROVAL_REQUIRED` for a suspension). */
export function unwrap<O>(envelope: Envelope<O>): O {
  if (envelope.status === "succeeded") return envelope.output;
  throw envelope.error;
}

const NO_CALL = { callId: "", attempt: 1, replayedFrom: null };

export function succeeded<O>(invocationId: string, output: O, modelOutput: Json): Succeeded<O> {
  return {
    ...NO_CALL,
    status: "succeeded",
    invocationId,
    output,
    modelOutput,
    error: null,
    approvalId: null,
    executedBeforeFailure: false,
  };
}

export function failed(
  invocationId: string,
  error: CapabilityError,
  executedBeforeFailure = false,
): Failed | Cancelled {
  const status = error.code === "CANCELLED" ? "cancelled" : "failed";
  return {
    ...NO_CALL,
    status,
    invocationId,
    output: null,
    modelOutput: null,
    error,
    approvalId: null,
    executedBeforeFailure,
  };
}

export function suspended(
  invocationId: string,
  error: CapabilityError,
  approvalId: string,
): Suspended {
  return {
    ...NO_CALL,
    status: "suspended",
    invocationId,
    output: null,
    modelOutput: null,
    error,
    approvalId,
    executedBeforeFailure: false,
  };
}
