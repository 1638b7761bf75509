"""The audit record: one row of ``audit_events``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from opentelemetry import trace

from warden.shared.ids import uuid7

Kind = Literal[
    "decision", "outcome", "approval", "policy", "registry", "access", "retention", "integrity"
]
KINDS: Final[tuple[Kind, ...]] = (
    "decision",
    "outcome",
    "approval",
    "policy",
    "registry",
    "access",
    "retention",
    "integrity",
)
"""Every kind of record: ``access`` is a read of the audit API (SI-13),
``retention`` a pruning with its checkpoint, ``integrity`` a row of the
registry, approvals or idempotency keys that failed its integrity check."""

COLUMNS: Final = (
    "seq",
    "event_id",
    "ts",
    "kind",
    "invocation_id",
    "capability_id",
    "capability_version",
    "service",
    "actor_id",
    "tenant",
    "surface",
    "status",
    "stage",
    "code",
    "exposed",
    "retryable",
    "public_message",
    "executed_before_failure",
    "policy_revision",
    "rules",
    "approval_id",
    "input_digest",
    "input",
    "output",
    "cause_type",
    "cause_message",
    "stack",
    "duration_ms",
    "trace_id",
    "reason",
    "details",
    "prev_hash",
    "hash",
    "call_id",
    "attempt",
)
"""Every column, in table order: SPEC §9's contract columns plus ``reason``
(the private truth behind a public face, e.g. ``hidden-by-policy``),
``details`` (the model-safe details that were returned), and ``call_id`` and
``attempt`` (which logical call an attempt belongs to, SI-11)."""


def current_trace_id() -> str | None:
    """The trace id of the span this thread is in (32 hex digits), or None outside a trace."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def new_event_id() -> str:
    """A record's id: a UUIDv7 (``warden.shared.ids``) in 32 hex digits, so
    that it is appended at the end of the store's unique index on it."""
    return uuid7().hex


def now_iso() -> str:
    """The current UTC time as ISO 8601 with milliseconds, e.g. 2026-01-02T03:04:05.678Z."""
    return iso(datetime.now(UTC))


def iso(moment: datetime) -> str:
    """A time as the store writes it: UTC, ISO 8601 with milliseconds and ``Z``.

    One fixed width, so stored times compare correctly as text.
    """
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class AuditEvent:
    """An audit record before the writer gives it its place in the chain.

    JSON-valued columns (``rules``, ``input``, ``output``, ``details``) hold
    JSON text, already redacted.
    """

    kind: Kind
    status: str
    invocation_id: str | None = None
    capability_id: str | None = None
    capability_version: str | None = None
    service: str | None = None
    actor_id: str | None = None
    tenant: str | None = None
    surface: str | None = None
    stage: str | None = None
    code: str | None = None
    exposed: bool | None = None
    retryable: bool | None = None
    public_message: str | None = None
    executed_before_failure: bool | None = None
    policy_revision: str | None = None
    rules: str | None = None
    approval_id: str | None = None
    input_digest: str | None = None
    input: str | None = None
    output: str | None = None
    cause_type: str | None = None
    cause_message: str | None = None
    stack: str | None = None
    duration_ms: int | None = None
    trace_id: str | None = dataclasses.field(default_factory=current_trace_id)
    """The trace the record was written in: a decision carries its Begin's trace."""
    reason: str | None = None
    details: str | None = None
    call_id: str | None = None
    attempt: int | None = None
    event_id: str = dataclasses.field(default_factory=new_event_id)
    ts: str = dataclasses.field(default_factory=now_iso)

    def row(self, seq: int, prev_hash: str) -> dict[str, Any]:
        """The row to store, without its hash (see ``chain.record_hash``)."""
        # Every field is a flat value: no deep copy needed (asdict would make one).
        row = {name: getattr(self, name) for name in _FIELDS}
        for flag in ("exposed", "retryable", "executed_before_failure"):
            if row[flag] is not None:
                row[flag] = int(row[flag])
        row.update(seq=seq, prev_hash=prev_hash)
        return row


_FIELDS: Final = tuple(f.name for f in dataclasses.fields(AuditEvent))
