"""Honest retries (SI-11): when the runtime may try a call again on its own,
and how long it waits first."""

from __future__ import annotations

import random
from dataclasses import dataclass

from warden._capability import SideEffect
from warden._envelope import Envelope
from warden._errors import WardenError

_SAFE_TO_REPEAT: tuple[SideEffect, ...] = ("read", "idempotent")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times, and how patiently, the runtime retries a call.

    The policy says how; ``may_retry`` says whether, and no policy overrides
    that. Waits grow exponentially from ``initial_backoff_ms`` up to
    ``max_backoff_ms`` with full jitter (a uniform draw below the cap), so
    that many callers failing together do not retry together. A
    ``retry_after_ms`` in the error's details (``RATE_LIMITED``) is waited
    out in full, up to ``max_wait_ms``: a longer one (a day's budget spent)
    is not waited for, and the call answers with that failure at once.

    Attributes:
        max_attempts: Attempts in all, the first included; 1 never retries.
        initial_backoff_ms: The cap of the first wait.
        max_backoff_ms: The cap no wait grows beyond.
        multiplier: How much the cap grows per attempt.
        max_wait_ms: The longest ``retry_after_ms`` the runtime waits out.
    """

    max_attempts: int = 3
    initial_backoff_ms: int = 100
    max_backoff_ms: int = 2_000
    multiplier: float = 2.0
    max_wait_ms: int = 10_000

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise WardenError("max_attempts must be at least 1")
        if self.initial_backoff_ms < 0 or self.max_backoff_ms < self.initial_backoff_ms:
            raise WardenError("backoffs must satisfy 0 <= initial_backoff_ms <= max_backoff_ms")
        if self.multiplier < 1:
            raise WardenError("multiplier must be at least 1")
        if self.max_wait_ms < 0:
            raise WardenError("max_wait_ms must not be negative")

    def waits_too_long(self, envelope: Envelope) -> bool:
        """Whether the failure asks for a longer wait than ``max_wait_ms``."""
        asked = _retry_after_ms(envelope)
        return asked is not None and asked > self.max_wait_ms

    def delay_s(self, attempt: int, envelope: Envelope, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (from 1)."""
        cap = min(self.max_backoff_ms, self.initial_backoff_ms * self.multiplier ** (attempt - 1))
        delay_ms = (rng or random).uniform(0, cap)
        asked = _retry_after_ms(envelope)
        if asked is not None:
            delay_ms = max(delay_ms, asked)
        return delay_ms / 1000


def _retry_after_ms(envelope: Envelope) -> float | None:
    details = envelope.error.details if envelope.error else None
    asked = details.get("retry_after_ms") if isinstance(details, dict) else None
    if isinstance(asked, int | float) and not isinstance(asked, bool):
        return float(asked)
    return None


NO_RETRY = RetryPolicy(max_attempts=1)
"""A policy that never retries."""


def may_retry(envelope: Envelope, side_effect: SideEffect | None, idempotency_key: str) -> bool:
    """Whether repeating this failed attempt is honest (SI-11).

    Only a retryable failure is retried, and only when repeating cannot do
    harm twice: the capability is ``read`` or ``idempotent``, or the call
    carries an idempotency key (the plane then runs it at most once). Never
    after the handler ran for a ``write``: its side effect may exist. A
    capability this runtime does not serve counts as a ``write``.
    """
    error = envelope.error
    if envelope.status != "failed" or error is None or not error.retryable:
        return False
    if envelope.replayed_from is not None:
        return False  # a replay answers the same way every time
    if error.stage == "approval":
        return False  # APPROVAL_EXPIRED: only a fresh call (a new approval) can succeed
    safe = side_effect in _SAFE_TO_REPEAT
    if envelope.executed_before_failure and not safe:
        return False
    return safe or bool(idempotency_key)
