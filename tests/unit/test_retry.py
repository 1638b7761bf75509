"""SI-11: the retry decision as a table, and the backoff it waits."""

from __future__ import annotations

import random

import pytest

import warden
from warden._retry import may_retry


def envelope(
    code: str = "TIMEOUT",
    *,
    status: str = "failed",
    retryable: bool | None = None,
    executed: bool = False,
    replayed_from: str | None = None,
    details: dict[str, object] | None = None,
) -> warden.Envelope:
    error = warden.CapabilityError(code, retryable=retryable, details=details)
    return warden.Envelope(
        status,  # type: ignore[arg-type]
        "inv",
        error=error,
        executed_before_failure=executed,
        replayed_from=replayed_from,
    )


@pytest.mark.parametrize(
    ("env", "side_effect", "key", "expected"),
    [
        # retryable, and safe to repeat
        (envelope("GOVERNANCE_UNAVAILABLE"), "read", "", True),
        (envelope("GOVERNANCE_UNAVAILABLE"), "idempotent", "", True),
        (envelope("GOVERNANCE_UNAVAILABLE"), "write", "k", True),
        (envelope("OPERATION_IN_PROGRESS"), "write", "k", True),
        (envelope("RATE_LIMITED"), "read", "", True),
        (envelope("TIMEOUT", executed=True), "read", "", True),
        (envelope("TIMEOUT", executed=True), "idempotent", "", True),
        # a write without a key never retries on its own
        (envelope("GOVERNANCE_UNAVAILABLE"), "write", "", False),
        (envelope("GOVERNANCE_UNAVAILABLE"), None, "", False),
        # never after the handler ran for a write, key or not
        (envelope("TIMEOUT", executed=True), "write", "k", False),
        (envelope("TIMEOUT", executed=True), "write", "", False),
        (envelope("TIMEOUT", executed=True), None, "k", False),
        # not retryable
        (envelope("POLICY_DENIED"), "read", "k", False),
        (envelope("INTERNAL_ERROR"), "read", "", False),
        (envelope("OUTCOME_UNKNOWN"), "read", "k", False),
        (envelope("NOT_ELIGIBLE", retryable=False), "read", "", False),
        (envelope("TRY_LATER", retryable=True), "read", "", True),
        # a replay, a cancellation, an expired approval: repeating changes nothing
        (envelope("TIMEOUT", replayed_from="first"), "read", "k", False),
        (envelope("CANCELLED", status="cancelled"), "read", "", False),
        (envelope("APPROVAL_EXPIRED"), "read", "", False),
    ],
)
def test_si11_may_retry(
    env: warden.Envelope, side_effect: str | None, key: str, expected: bool
) -> None:
    assert may_retry(env, side_effect, key) is expected  # type: ignore[arg-type]


def test_si11_a_success_is_never_retried() -> None:
    assert not may_retry(warden.Envelope("succeeded", "inv"), "read", "k")


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    policy = warden.RetryPolicy(
        max_attempts=10, initial_backoff_ms=100, max_backoff_ms=1_000, multiplier=2
    )
    rng = random.Random(7)
    failed = envelope("TIMEOUT")
    for attempt, cap_ms in [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1_000), (9, 1_000)]:
        delays = [policy.delay_s(attempt, failed, rng) for _ in range(300)]
        assert all(0 <= d <= cap_ms / 1000 for d in delays)
        assert max(delays) > 0.8 * cap_ms / 1000, "the draw spans the whole range"
        assert min(delays) < 0.2 * cap_ms / 1000


def test_backoff_waits_out_retry_after() -> None:
    policy = warden.RetryPolicy(initial_backoff_ms=10, max_backoff_ms=10)
    limited = envelope("RATE_LIMITED", details={"retry_after_ms": 1_500})
    assert policy.delay_s(1, limited, random.Random(1)) == 1.5


def test_a_retry_after_beyond_max_wait_is_not_waited_for() -> None:
    policy = warden.RetryPolicy()
    assert not policy.waits_too_long(envelope("RATE_LIMITED", details={"retry_after_ms": 10_000}))
    day = envelope("RATE_LIMITED", details={"retry_after_ms": 86_400_000})
    assert policy.waits_too_long(day)
    assert not warden.RetryPolicy(max_wait_ms=86_400_000).waits_too_long(day)
    assert not policy.waits_too_long(envelope("TIMEOUT"))


@pytest.mark.parametrize(
    "arguments",
    [
        {"max_wait_ms": -1},
        {"max_attempts": 0},
        {"initial_backoff_ms": -1},
        {"initial_backoff_ms": 500, "max_backoff_ms": 100},
        {"multiplier": 0.5},
    ],
)
def test_a_policy_that_makes_no_sense_is_refused(arguments: dict[str, float]) -> None:
    """A bad argument is an error of the SDK itself, as ``docs/sdk.md`` says:
    a WardenError."""
    with pytest.raises(warden.WardenError, match="must"):
        warden.RetryPolicy(**arguments)  # type: ignore[arg-type]
