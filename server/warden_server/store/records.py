"""Rows of the store's tables, as plain values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class CapabilityRecord:
    """One registered, immutable version of a capability."""

    id: str
    version: str
    service: str
    digest: str
    definition: dict[str, Any]
    """The definition as JSON (see ``registry.CapabilityDefinition``)."""
    registered_at: str


@dataclass(frozen=True, slots=True)
class InvocationRecord:
    """A granted invocation, until its outcome is reported."""

    invocation_id: str
    service: str
    capability_id: str
    capability_version: str
    actor_id: str
    tenant: str
    surface: str
    input_digest: str
    state: str
    """``granted`` or ``completed``."""
    granted_at: str
    expires_at: str
    completed_at: str | None = None
    call_id: str | None = None
    """The logical call this attempt belongs to (SI-11)."""
    attempt: int | None = None
    outcome_seq: int | None = None
    """The audit record of the outcome, once reported."""
    outcome_digest: str | None = None
    """A digest of the report that made it (``pipeline.complete.report_digest``)."""


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """A request for a human to approve one call, bound per SI-6."""

    approval_id: str
    capability_id: str
    capability_version: str
    service: str
    requester_id: str
    tenant: str
    input_digest: str
    input: str
    """The redacted input, as JSON, for the approver to read."""
    rule_id: str
    message: str
    approvers: str
    """The rule's CEL condition over ``approver``, as it read when requested."""
    state: str
    """``pending``, ``approved``, ``denied``, ``expired`` or ``consumed``."""
    created_at: str
    expires_at: str
    decided_by: str | None = None
    reason: str | None = None
    decided_at: str | None = None
    invocation_id: str | None = None
    """The suspended invocation that asked for it."""
    policy_revision: str | None = None
    """The policy revision that asked for it."""
    requester: str | None = None
    """The requester's claims as JSON (``id``, ``roles``, ``tenant``, ``attrs``),
    so that the approvers condition can read them when an approver decides."""


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """A reserved idempotency key (SPEC §8): scoped to service, capability and
    actor, bound to one input digest, held by one invocation."""

    service: str
    capability_id: str
    actor_id: str
    key: str
    input_digest: str
    invocation_id: str
    """The invocation that holds the reservation (and ran the handler)."""
    state: str
    """``in_progress`` until the outcome arrives, then ``completed``."""
    created_at: str
    expires_at: str
    completed_at: str | None = None
    status: str | None = None
    """The recorded outcome: ``succeeded``, ``failed`` or ``cancelled``."""
    failure: str | None = None
    """The recorded failure's public face, as JSON."""
    executed_before_failure: bool | None = None
    sealed_output: bytes | None = None
    """The output, sealed (see ``sealing``): never stored in clear."""


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    """What one replica of the plane (the processes of one ``warden serve``)
    reported it serves, the last time it reported."""

    replica_id: str
    host: str
    processes: int
    revision: str
    """The policy revision in force."""
    loaded_at: str
    """When that revision was put in force."""
    refused_revision: str | None
    """The newest change of its policy folder that was refused, while it stands."""
    refused_at: str | None
    registrations: int
    """How many capability versions it has read from the registry."""
    leader: bool
    """Whether it runs the periodic work done once for the cluster."""
    started_at: str
    seen_at: str


@dataclass(frozen=True, slots=True)
class LimitHold:
    """What a granted call holds of a budget or a concurrency cap, until
    ``until`` (seconds since the epoch) or until its outcome gives it back."""

    limit_id: str
    limit_key: str
    invocation_id: str
    kind: str
    """``budget`` or ``concurrency``."""
    amount: float
    """The call's cost (budget) or 1 (concurrency)."""
    at: float
    until: float


@dataclass(frozen=True, slots=True)
class LimitUsage:
    """One key's state under one limit."""

    limit_id: str
    limit_key: str
    bucket: float | None
    """rate: when the token bucket will be full again (seconds since the epoch)."""
    holds: tuple[LimitHold, ...] = ()
    """budget and concurrency: the live holds, soonest to end first."""
