"""The approver's client: list, inspect, approve, deny and watch approvals.

A UI or a chat bot acts for a human approver with that approver's JWT::

    with warden.Approvals("127.0.0.1:50051", token=APPROVER_JWT) as approvals:
        for event in approvals.watch(include_pending=True):
            if event.approval.may_decide:
                approvals.approve(event.approval.id)
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import BaseModel, ConfigDict

from warden._transport import ApprovalsTransport
from warden.shared.tls import TLS
from warden.v1 import approvals_pb2

ApprovalState = Literal["pending", "approved", "denied", "expired", "consumed"]
ApprovalEventType = Literal["requested", "approved", "denied", "expired", "consumed", "pending"]

_STATES: dict[ApprovalState, approvals_pb2.ApprovalState.ValueType] = {
    "pending": approvals_pb2.APPROVAL_STATE_PENDING,
    "approved": approvals_pb2.APPROVAL_STATE_APPROVED,
    "denied": approvals_pb2.APPROVAL_STATE_DENIED,
    "expired": approvals_pb2.APPROVAL_STATE_EXPIRED,
    "consumed": approvals_pb2.APPROVAL_STATE_CONSUMED,
}
_STATE_NAMES = {number: name for name, number in _STATES.items()}
_EVENT_TYPES: dict[approvals_pb2.ApprovalEventType.ValueType, ApprovalEventType] = {
    approvals_pb2.APPROVAL_EVENT_TYPE_REQUESTED: "requested",
    approvals_pb2.APPROVAL_EVENT_TYPE_APPROVED: "approved",
    approvals_pb2.APPROVAL_EVENT_TYPE_DENIED: "denied",
    approvals_pb2.APPROVAL_EVENT_TYPE_EXPIRED: "expired",
    approvals_pb2.APPROVAL_EVENT_TYPE_CONSUMED: "consumed",
    approvals_pb2.APPROVAL_EVENT_TYPE_PENDING: "pending",
}


class Approval(BaseModel):
    """A request for a human to approve one call, as an approver sees it."""

    model_config = ConfigDict(frozen=True)

    id: str
    capability_id: str
    capability_version: str
    service: str
    requester_id: str
    """The actor the call is made for; never allowed to decide it."""
    tenant: str
    input: Any
    """The call's arguments, sensitive fields redacted."""
    input_digest: str
    """What the approval is bound to: SHA-256 of the RFC 8785 canonical input."""
    rule_id: str
    message: str
    state: ApprovalState
    created_at: datetime
    expires_at: datetime
    decided_by: str | None = None
    reason: str | None = None
    decided_at: datetime | None = None
    invocation_id: str | None = None
    """The suspended invocation that asked for it."""
    policy_revision: str | None = None
    may_decide: bool = False
    """Whether this approver may decide it now."""


class ApprovalEvent(BaseModel):
    """Something that happened to an approval (``pending``: one that was
    already waiting when the watch began)."""

    model_config = ConfigDict(frozen=True)

    type: ApprovalEventType
    approval: Approval


class Approvals:
    """An approver's connection to the plane.

    Every method raises ``ApprovalError`` when the plane refuses (its
    ``status`` says why) or cannot be reached.

    Args:
        target: The plane's ``host:port``.
        token: The approver's JWT.
        timeout_ms: How long to wait for each answer (not for ``watch``).
        tls: How to reach a plane that serves TLS (``warden.TLS``); plaintext when None.
    """

    def __init__(
        self, target: str, *, token: str, timeout_ms: int = 5_000, tls: TLS | None = None
    ) -> None:
        self.target = target
        self._transport = ApprovalsTransport(target, token, timeout_s=timeout_ms / 1000, tls=tls)

    def list(
        self, *, states: Sequence[ApprovalState] = ("pending",), limit: int = 100
    ) -> list[Approval]:
        """The tenant's approvals in ``states`` (every state when empty), newest first."""
        request = approvals_pb2.ListApprovalsRequest(
            states=[_STATES[s] for s in states], limit=limit
        )
        return [_approval(a) for a in self._transport.list(request)]

    def get(self, approval_id: str) -> Approval:
        """One approval of the tenant."""
        return _approval(self._transport.get(approval_id))

    def approve(self, approval_id: str, *, reason: str = "") -> Approval:
        """Approve a pending approval; approving it again is a no-op."""
        return _approval(self._transport.approve(approval_id, reason))

    def deny(self, approval_id: str, *, reason: str) -> Approval:
        """Deny a pending approval; the resumed call's APPROVAL_DENIED carries the reason."""
        return _approval(self._transport.deny(approval_id, reason))

    def watch(self, *, include_pending: bool = False) -> Iterator[ApprovalEvent]:
        """The tenant's approval events as they happen, for as long as you iterate.

        With ``include_pending`` the approvals already waiting come first (as
        ``pending`` events). Leaving the loop (or closing the iterator) ends the
        stream; so does ``close()`` from another thread.
        """
        for event in self._transport.watch(include_pending):
            yield ApprovalEvent(type=_EVENT_TYPES[event.type], approval=_approval(event.approval))

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Approvals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _approval(message: approvals_pb2.Approval) -> Approval:
    return Approval(
        id=message.id,
        capability_id=message.capability_id,
        capability_version=message.capability_version,
        service=message.service,
        requester_id=message.requester_id,
        tenant=message.tenant,
        input=json.loads(message.input_json) if message.input_json else None,
        input_digest=message.input_digest,
        rule_id=message.rule_id,
        message=message.message,
        state=_STATE_NAMES[message.state],
        created_at=_time(message.created_at),
        expires_at=_time(message.expires_at),
        decided_by=message.decided_by or None,
        reason=message.reason or None,
        decided_at=_time(message.decided_at) if message.HasField("decided_at") else None,
        invocation_id=message.invocation_id or None,
        policy_revision=message.policy_revision or None,
        may_decide=message.may_decide,
    )


def _time(stamp: Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)
