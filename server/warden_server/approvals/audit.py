"""The audit records of the approval lifecycle (``kind = approval``).

A record carries the approval's facts (capability, service, tenant, input
digest) when the approval is known, and the actor who acted: the requester
for ``requested``, ``consumed`` and refused uses, the approver for decisions
and refused decisions, nobody for an expiry.
"""

from __future__ import annotations

from typing import Any

from warden.shared.canonical import compact_json
from warden_server.auth.actors import Actor
from warden_server.records.events import AuditEvent
from warden_server.store import ApprovalRecord

MAX_PRESENTED_ID = 200
"""An approval id as presented is recorded up to this length (it is caller input)."""


def approval_event(
    status: str,
    approval_id: str,
    approval: ApprovalRecord | None,
    *,
    actor: Actor | None,
    policy_revision: str,
    invocation_id: str | None = None,
    surface: str | None = None,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
    called: tuple[str, str, str] | None = None,
) -> AuditEvent:
    """An approval audit record.

    Args:
        status: ``requested``, ``approved``, ``denied``, ``expired``,
            ``consumed``, or ``refused`` for a refused attempt to decide or use.
        approval_id: The approval's id as presented.
        approval: The approval, when one with that id exists and may be named.
        actor: Who acted, if anyone did.
        policy_revision: The policy revision in force.
        invocation_id: The invocation that acted; the one that asked for the
            approval when None.
        reason: Private: why (``separation-of-duties``, ``approval-expired``, ...).
        details: Private structured facts, such as the denial's reason.
        called: The capability id, version and service of the call that
            presented the approval: the record's when ``approval`` is None.
    """
    capability_id, capability_version, service = (
        (approval.capability_id, approval.capability_version, approval.service)
        if approval
        else called or (None, None, None)
    )
    return AuditEvent(
        kind="approval",
        status=status,
        invocation_id=invocation_id or (approval.invocation_id if approval else None),
        capability_id=capability_id,
        capability_version=capability_version,
        service=service,
        actor_id=actor.id if actor else None,
        tenant=approval.tenant if approval else (actor.tenant if actor else None),
        surface=surface,
        stage="approval" if status == "refused" else None,
        policy_revision=policy_revision,
        approval_id=approval_id[:MAX_PRESENTED_ID] or None,
        input_digest=approval.input_digest if approval else None,
        reason=reason,
        details=compact_json(details) if details else None,
    )
