"""Step 8: approval — suspend for a human, or check the approval presented.

A new ``require_approval`` decision creates a pending approval bound to the
capability id and version, the requester and the input digest (SI-6). A
resumed call must present an approval bound to exactly that; it is consumed
atomically when the grant is written, so it works once.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from warden_server.pipeline.context import BeginContext
from warden_server.pipeline.failure import Failure, fail
from warden_server.policy.model import parse_duration

if TYPE_CHECKING:
    from warden_server.plane import Plane


def approval(plane: Plane, ctx: BeginContext) -> Failure | None:
    decision = ctx.decision
    if decision is None or decision.effect != "require_approval":
        return None
    assert decision.rule is not None and ctx.capability is not None and ctx.actor is not None
    if not ctx.request.approval_id:
        ttl = decision.rule.ttl_seconds or parse_duration(plane.config.server.approval_ttl)
        ctx.approval_id = uuid.uuid4().hex
        expires = ctx.now + timedelta(seconds=ttl)
        ctx.extra["approval_expires_at"] = expires
        return suspended(ctx.approval_id, expires, decision.message, "approval-requested")

    record = plane.store.get_approval(ctx.request.approval_id)
    bound = record is not None and (
        record.capability_id == ctx.capability.id
        and record.capability_version == ctx.capability.version
        and record.service == ctx.request.service.name
        and record.requester_id == ctx.actor.id
        and record.input_digest == ctx.input_digest
    )
    if record is None or not bound:
        # The same answer for a missing approval and someone else's: nothing leaks.
        return fail("APPROVAL_DENIED", "approval-not-bound")
    ctx.approval_id = record.approval_id
    expires = datetime.fromisoformat(record.expires_at)
    if record.state == "expired" or (
        record.state in ("pending", "approved") and ctx.now >= expires
    ):
        return fail("APPROVAL_EXPIRED", "approval-expired")
    if record.state == "pending":
        return suspended(record.approval_id, expires, record.message, "approval-pending")
    if record.state == "denied":
        details = {"reason": record.reason} if record.reason else None
        return fail("APPROVAL_DENIED", "approval-denied", details=details)
    if record.state == "consumed":
        if ctx.request.idempotency_key:
            # Perhaps a repeat of the resume that consumed it: the idempotency
            # stage replays that call, or refuses.
            ctx.approval_used_before = True
            return None
        return fail("APPROVAL_DENIED", "approval-already-used")
    ctx.consume_approval = True
    return None


def suspended(approval_id: str, expires: datetime, message: str | None, reason: str) -> Failure:
    return fail(
        "APPROVAL_REQUIRED",
        reason,
        message=message,
        details={"approval_id": approval_id, "expires_at": iso(expires)},
    )


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
