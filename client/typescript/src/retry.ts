/**
 * Honest retries (SI-11): when the runtime may try a call again on its own,
 * and how long it waits first.
 */

import type { Envelope } from "./envelope.js";

export type SideEffect = "read" | "write" | "idempotent";

/**
 * How many times, and how patiently, the runtime retries a call. The policy
 * says how; `mayRetry` says whether, and no policy overrides it.
 */
export interface RetryPolicy {
  /** Attempts in all, the first included; 1 never retries. */
  readonly maxAttempts: number;
  /** The cap of the first wait. */
  readonly initialBackoffMs: number;
  /** The cap no wait grows beyond. */
  readonly maxBackoffMs: number;
  /** How much the cap grows per attempt. */
  readonly multiplier: number;
  /**
   * The longest `retry_after_ms` the runtime waits out (10 s when unset): a
   * longer one (a day's budget spent) is not waited for, and the call answers
   * with that failure at once.
   */
  readonly maxWaitMs?: number;
}

export const DEFAULT_RETRY: RetryPolicy = {
  maxAttempts: 3,
  initialBackoffMs: 100,
  maxBackoffMs: 2_000,
  multiplier: 2,
  maxWaitMs: 10_000,
};

/** Whether the failure asks for a longer wait than the policy's `maxWaitMs`. */
export function waitsTooLong(policy: RetryPolicy, envelope: Envelope): boolean {
  const asked = envelope.error?.details?.retry_after_ms;
  return typeof asked === "number" && asked > (policy.maxWaitMs ?? 10_000);
}

/** A policy that never retries. */
export const NO_RETRY: RetryPolicy = { ...DEFAULT_RETRY, maxAttempts: 1 };

/**
 * Milliseconds to wait after failed attempt number `attempt` (from 1): full
 * jitter below an exponentially growing cap, and at least a `retry_after_ms`
 * the error's details ask for.
 */
export function delayMs(
  policy: RetryPolicy,
  attempt: number,
  envelope: Envelope,
  random: () => number = Math.random,
): number {
  const cap = Math.min(
    policy.maxBackoffMs,
    policy.initialBackoffMs * policy.multiplier ** (attempt - 1),
  );
  let delay = random() * cap;
  const asked = envelope.error?.details?.retry_after_ms;
  if (typeof asked === "number") delay = Math.max(delay, asked);
  return delay;
}

/**
 * Whether repeating this failed attempt is honest (SI-11): only a retryable
 * failure, only when repeating cannot do harm twice (the capability is `read`
 * or `idempotent`, or the call carries an idempotency key), never after the
 * handler ran for a `write`, never a replay or an approval's failure. A
 * capability this runtime does not serve counts as a `write`.
 */
export function mayRetry(
  envelope: Envelope,
  sideEffect: SideEffect | null,
  idempotencyKey: string | null,
): boolean {
  const error = envelope.error;
  if (envelope.status !== "failed" || error === null || !error.retryable) return false;
  if (envelope.replayedFrom !== null) return false;
  if (error.stage === "approval") return false;
  const safe = sideEffect === "read" || sideEffect === "idempotent";
  if (envelope.executedBeforeFailure && !safe) return false;
  return safe || Boolean(idempotencyKey);
}
