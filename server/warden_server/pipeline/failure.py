"""A stage's failure: the public face, plus the private reason for the audit log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from warden.shared.codes import defaults


@dataclass(frozen=True, slots=True)
class Failure:
    code: str
    stage: str
    public_message: str
    retryable: bool
    exposed: bool
    reason: str
    """Private: why, for the audit log only (e.g. ``hidden-by-policy``)."""
    details: dict[str, Any] | None = None


ALREADY_USED: Final = "This approval was used already; a new call needs a new approval."
"""The public message for a used approval presented again (to its own
requester, bound to this very call: nothing is revealed to anyone else)."""


def already_used() -> Failure:
    """The answer to a resume that presents an approval some call consumed."""
    return fail("APPROVAL_DENIED", "approval-already-used", message=ALREADY_USED)


def fail(
    code: str,
    reason: str,
    *,
    stage: str | None = None,
    message: str | None = None,
    details: dict[str, Any] | None = None,
) -> Failure:
    """A failure with a built-in code's defaults, overridden where given."""
    known = defaults(code)
    return Failure(
        code=code,
        stage=stage or known.stage,
        public_message=message or known.public_message,
        retryable=known.retryable,
        exposed=known.exposed,
        reason=reason,
        details=details,
    )


def not_found(reason: str) -> Failure:
    """The concealment class (SI-8): identical for every reason; only the
    private reason differs."""
    return fail("CAPABILITY_NOT_FOUND", reason)
