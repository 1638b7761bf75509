"""Step 8: approval — suspend for a human, or check the approval presented.

A new ``require_approval`` decision creates a pending approval bound to the
capability id and version, the requester (id and tenant) and the input digest
(SI-6). A resumed call must present an approval bound to exactly that and
asked for by the rule that requires approval now; it is consumed atomically
when the grant is written, so it works once. A resume the rules no longer ask
approval for consumes the open approval it presented all the same.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from warden_server.approvals.audit import approval_event
from warden_server.approvals.events import ApprovalChange
from warden_server.approvals.expiry import expire, is_due
from warden_server.pipeline.context import BeginContext
from warden_server.pipeline.failure import Failure, already_used, fail
from warden_server.policy.model import parse_duration
from warden_server.records.events import iso
from warden_server.store import ApprovalRecord, WriteTransaction

if TYPE_CHECKING:
    from warden_server.plane import Plane


def approval(plane: Plane, ctx: BeginContext) -> Failure | None:
    decision = ctx.decision
    if decision is None or decision.effect != "require_approval":
        if ctx.request.approval_id:
            _supersede(plane, ctx)
        return None
    assert decision.rule is not None and ctx.capability is not None and ctx.actor is not None
    if not ctx.request.approval_id:
        return _request(plane, ctx, "approval-requested")

    record = plane.store.get_approval(ctx.request.approval_id)
    unbound = _unbound(ctx, record)
    if record is None or unbound:
        # The same answer for a missing approval and someone else's: nothing leaks.
        # The audit log learns which part of the binding failed.
        return fail("APPROVAL_DENIED", "approval-not-bound:" + (unbound or "unknown-id"))
    ctx.approval = record
    if record.rule_id != decision.rule.id:
        # The policies changed and another rule asks now: its approvers decide afresh.
        return _request(plane, ctx, "approval-rule-changed")
    ctx.approval_id = record.approval_id
    if record.state == "expired" or is_due(record, ctx.now):
        return fail("APPROVAL_EXPIRED", "approval-expired")
    if record.state == "pending":
        expires = datetime.fromisoformat(record.expires_at)
        return suspended(record.approval_id, expires, record.message, "approval-pending")
    if record.state == "denied":
        details = {"reason": record.reason} if record.reason else None
        return fail("APPROVAL_DENIED", "approval-denied", details=details)
    if record.state == "consumed":
        # A repeat of the keyed resume that consumed it was answered by the
        # idempotency stage, which runs first.
        return already_used()
    ctx.consume_approval = True
    return None


def _supersede(plane: Plane, ctx: BeginContext) -> None:
    """The call presented an approval the rules no longer ask for: it runs as
    they allow, and an approval bound to it that is still open goes with it."""
    record = plane.store.get_approval(ctx.request.approval_id)
    if record is None or _unbound(ctx, record) or record.state not in ("pending", "approved"):
        return
    if is_due(record, ctx.now):
        return
    ctx.approval = record
    ctx.approval_id = record.approval_id
    ctx.approval_superseded = True


def _request(plane: Plane, ctx: BeginContext, reason: str) -> Failure:
    decision = ctx.decision
    assert decision is not None and decision.rule is not None
    ttl = decision.rule.ttl_seconds or parse_duration(plane.config.server.approval_ttl)
    ctx.approval_id = uuid.uuid4().hex
    expires = ctx.now + timedelta(seconds=ttl)
    ctx.extra["approval_expires_at"] = expires
    return suspended(ctx.approval_id, expires, decision.message, reason)


def _unbound(ctx: BeginContext, record: ApprovalRecord | None) -> str:
    """The parts of the binding (SI-6) the approval does not match, comma separated."""
    if record is None:
        return ""
    assert ctx.capability is not None and ctx.actor is not None
    expected = {
        "capability_id": ctx.capability.id,
        "capability_version": ctx.capability.version,
        "service": ctx.request.service.name,
        "requester": ctx.actor.id,
        # An actor is its id within its tenant: another tenant's "sam" is
        # another person (SI-13).
        "tenant": ctx.actor.tenant,
        "input_digest": ctx.input_digest,
    }
    actual = {
        "capability_id": record.capability_id,
        "capability_version": record.capability_version,
        "service": record.service,
        "requester": record.requester_id,
        "tenant": record.tenant,
        "input_digest": record.input_digest,
    }
    return ",".join(key for key in expected if expected[key] != actual[key])


def record_refused_use(
    tx: WriteTransaction, ctx: BeginContext, failure: Failure
) -> list[ApprovalChange]:
    """Audit a Begin that presented an approval and was refused (a pending
    approval's resume is not refused: it is still waiting). An approval whose
    time is up is marked expired on the way."""
    presented = ctx.request.approval_id
    if not presented or (failure.code == "APPROVAL_REQUIRED" and ctx.approval_id == presented):
        return []
    changes = []
    if ctx.approval is not None and is_due(ctx.approval, ctx.now):
        change = expire(tx, ctx.approval, ctx.now, ctx.policies.revision)
        if change is not None:
            changes.append(change)
    tx.append_audit(
        approval_event(
            "refused",
            presented,
            ctx.approval,
            actor=ctx.actor,
            policy_revision=ctx.policies.revision,
            invocation_id=ctx.request.invocation_id,
            surface=ctx.request.surface,
            reason=failure.reason,
            details={"attempt": "use"},
            called=(
                (ctx.capability.id, ctx.capability.version, ctx.request.service.name)
                if ctx.capability
                else None
            ),
        )
    )
    return changes


def suspended(approval_id: str, expires: datetime, message: str | None, reason: str) -> Failure:
    return fail(
        "APPROVAL_REQUIRED",
        reason,
        message=message,
        details={"approval_id": approval_id, "expires_at": iso(expires)},
    )
