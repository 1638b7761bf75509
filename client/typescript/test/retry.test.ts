/** How patiently the runtime retries: a plane's `retry_after_ms` is waited out only up to `maxWaitMs`. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { failed } from "../src/envelope.js";
import { CapabilityError } from "../src/errors.js";
import { DEFAULT_RETRY, delayMs, waitsTooLong } from "../src/retry.js";

function limited(retryAfterMs: number) {
  const error = new CapabilityError("RATE_LIMITED", undefined, {
    details: { retry_after_ms: retryAfterMs },
  });
  return failed("inv", error);
}

test("a retry_after_ms within maxWaitMs is waited out in full", () => {
  assert.equal(waitsTooLong(DEFAULT_RETRY, limited(1_500)), false);
  assert.equal(
    delayMs(DEFAULT_RETRY, 1, limited(1_500), () => 0),
    1_500,
  );
});

test("a longer one (a day's budget spent) is not waited for", () => {
  assert.equal(waitsTooLong(DEFAULT_RETRY, limited(86_400_000)), true);
  assert.equal(
    waitsTooLong({ ...DEFAULT_RETRY, maxWaitMs: 100_000_000 }, limited(86_400_000)),
    false,
  );
  const { maxWaitMs: _, ...unset } = DEFAULT_RETRY;
  assert.equal(waitsTooLong(unset, limited(10_001)), true, "10 s when unset");
});
