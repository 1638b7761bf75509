"""Seeing and deciding approvals (SPEC §7, SI-6).

An approver acts with their own JWT and sees only their tenant's approvals. To
decide one they must not be its requester (separation of duties) and must
satisfy the ``approvers`` condition of the rule that asked for it, evaluated
over ``approver``, ``requester``, ``capability`` and ``input`` (the input as
stored: sensitive fields redacted).

The condition is taken from the *current* policy set, found by the rule's id:
a policy change that narrows who may approve applies at once to approvals
already waiting, and a change that withdraws the rule (or stops it asking for
approval) leaves its approvals undecidable until they expire. Nothing is lost
by that: a resumed call re-runs the policies and asks afresh if a rule still
requires it.

A pending approval is decided once. Repeating one's own decision is a no-op;
any other second decision is refused. Every decision and every refused
attempt is an audit record.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from warden_server.approvals.audit import approval_event
from warden_server.approvals.events import ApprovalChange
from warden_server.approvals.expiry import as_of, expire, is_due
from warden_server.auth.actors import Actor, AuthenticationError
from warden_server.errors import InvalidRequest, NotFound, PermissionDenied, RequestError
from warden_server.policy.cel import EvaluationError, error_in_words
from warden_server.policy.engine import PolicySet
from warden_server.policy.variables import approver_variables
from warden_server.records.events import iso
from warden_server.store import ApprovalRecord, WriteTransaction

if TYPE_CHECKING:
    from warden_server.plane import Plane

Verdict = Literal["approved", "denied"]
STATES = ("pending", "approved", "denied", "expired", "consumed")
MAX_LIST = 1000
MAX_REASON = 2000


class ApprovalClosed(RequestError):
    """The approval can no longer be decided: expired, decided by someone else,
    or its rule withdrawn."""


@dataclass(frozen=True, slots=True)
class ApprovalView:
    """An approval as one approver sees it."""

    approval: ApprovalRecord
    may_decide: bool
    """Whether this approver may decide it now."""


@dataclass(frozen=True, slots=True)
class _Refusal:
    reason: str
    """Private: for the audit log."""
    error: Exception
    """What the approver is told."""


def list_approvals(
    plane: Plane, approver: Actor, states: Sequence[str] = (), limit: int = 100
) -> list[ApprovalView]:
    """The approver's tenant's approvals, newest first.

    Raises:
        InvalidRequest: an unknown state or a limit above ``MAX_LIST``.
    """
    unknown = sorted(set(states) - set(STATES))
    if unknown:
        raise InvalidRequest(f"unknown approval states {unknown} (known: {', '.join(STATES)})")
    if limit > MAX_LIST:
        raise InvalidRequest(f"limit must be at most {MAX_LIST}")
    now = plane.clock()
    # Stored states lag expiry until the sweeper runs: filter on the state as of now.
    stored = set(states) | ({"pending", "approved"} if "expired" in states else set())
    found = (
        as_of(a, now) for a in plane.store.list_approvals(approver.tenant, sorted(stored), limit)
    )
    return [view(plane, approver, a) for a in found if not states or a.state in states]


def get_approval(plane: Plane, approver: Actor, approval_id: str) -> ApprovalView:
    """One approval of the approver's tenant.

    Raises:
        NotFound: no such approval, or another tenant's (indistinguishable).
    """
    approval = plane.store.get_approval(approval_id) if approval_id else None
    if approval is None or approval.tenant != approver.tenant:
        raise _not_found(approval_id)
    return view(plane, approver, as_of(approval, plane.clock()))


def view(plane: Plane, approver: Actor, approval: ApprovalRecord) -> ApprovalView:
    """The approval with whether ``approver`` may decide it now."""
    may_decide = approval.state == "pending" and not is_due(approval, plane.clock())
    if may_decide:
        may_decide = _refusal(plane, plane.policies.current(), approver, approval) is None
    return ApprovalView(approval, may_decide)


def decide(
    plane: Plane,
    authenticate: Callable[[], Actor],
    approval_id: str,
    verdict: Verdict,
    reason: str = "",
) -> ApprovalView:
    """Approve or deny a pending approval.

    Args:
        authenticate: Returns the approver, or raises AuthenticationError;
            an attempt that fails it is recorded like every refused attempt.

    Raises:
        AuthenticationError: no acceptable approver credential.
        InvalidRequest: a denial without a reason, or a reason too long.
        NotFound: no such approval in the approver's tenant.
        PermissionDenied: the approver is the requester, or the rule does not
            allow them.
        ApprovalClosed: expired, already decided by someone else, or its
            rule is withdrawn.
    """
    now = plane.clock()
    policies = plane.policies.current()
    attempt = "approve" if verdict == "approved" else "deny"
    reason = reason.strip()

    def refuse(
        approver: Actor | None, approval: ApprovalRecord | None, refusal: _Refusal
    ) -> NoReturn:
        event = approval_event(
            "refused",
            approval_id,
            approval,
            actor=approver,
            policy_revision=policies.revision,
            reason=refusal.reason,
            details={"attempt": attempt},
        )
        plane.store.transact(lambda tx: tx.append_audit(event))
        raise refusal.error

    try:
        approver = authenticate()
    except AuthenticationError as exc:
        refuse(None, None, _Refusal(f"unauthenticated: {exc}", exc))
    approval = plane.store.get_approval(approval_id) if approval_id else None
    if approval is None or approval.tenant != approver.tenant:
        # Another tenant's approval is recorded against that tenant (whose it is),
        # and answered exactly like one that does not exist.
        private = "not-found" if approval is None else "other-tenant"
        refuse(approver, approval, _Refusal(private, _not_found(approval_id)))
    if verdict == "denied" and not reason:
        refuse(approver, approval, _Refusal("no-reason", InvalidRequest("a denial needs a reason")))
    if len(reason) > MAX_REASON:
        refuse(
            approver,
            approval,
            _Refusal("reason-too-long", InvalidRequest(f"reason is over {MAX_REASON} characters")),
        )
    if is_due(approval, now):
        _expire_refusing(plane, approver, approval, attempt, now, policies.revision)
    if approval.state == verdict and approval.decided_by == approver.id:
        return ApprovalView(approval, may_decide=False)
    refusal = _refusal(plane, policies, approver, approval)
    if refusal is not None:
        refuse(approver, approval, refusal)
    if approval.state != "pending":
        by = f" by {approval.decided_by}" if approval.decided_by else ""
        if approval.state == "consumed":  # decided_by approved it; the resumed call used it
            by = f" (approved{by}, then used by the resumed call)"
        closed = ApprovalClosed(f"approval {approval.approval_id} is already {approval.state}{by}")
        refuse(approver, approval, _Refusal(f"already-{approval.state}", closed))
    decided = dataclasses.replace(
        approval, state=verdict, decided_by=approver.id, reason=reason or None, decided_at=iso(now)
    )

    def work(tx: WriteTransaction) -> bool:
        if not tx.decide_approval(
            approval.approval_id, verdict, approver.id, decided.reason, iso(now)
        ):
            return False
        details = {"reason": reason} if reason else None
        tx.append_audit(
            approval_event(
                verdict,
                approval.approval_id,
                decided,
                actor=approver,
                policy_revision=policies.revision,
                details=details,
            )
        )
        return True

    if not plane.store.transact(work):
        # Another decision (or the expiry) got there first: answer as one who
        # arrived after it. States only move forward, so this ends.
        return decide(plane, authenticate, approval_id, verdict, reason)
    plane.approval_events.publish([ApprovalChange(verdict, decided)])
    return ApprovalView(decided, may_decide=False)


def _expire_refusing(
    plane: Plane,
    approver: Actor,
    approval: ApprovalRecord,
    attempt: str,
    now: datetime,
    revision: str,
) -> NoReturn:

    def work(tx: WriteTransaction) -> ApprovalChange | None:
        change = expire(tx, approval, now, revision)
        tx.append_audit(
            approval_event(
                "refused",
                approval.approval_id,
                approval,
                actor=approver,
                policy_revision=revision,
                reason="approval-expired",
                details={"attempt": attempt},
            )
        )
        return change

    change = plane.store.transact(work)
    if change is not None:
        plane.approval_events.publish([change])
    raise ApprovalClosed(f"approval {approval.approval_id} expired at {approval.expires_at}")


def _refusal(
    plane: Plane, policies: PolicySet, approver: Actor, approval: ApprovalRecord
) -> _Refusal | None:
    """Why this approver may not decide this approval, or None if they may."""
    if approver.id == approval.requester_id:
        return _Refusal(
            "separation-of-duties",
            PermissionDenied(
                "the requester of a call cannot decide its approval (separation of duties)"
            ),
        )
    rule = next(
        (r for r in policies.rules_for(approval.capability_id) if r.id == approval.rule_id), None
    )
    if (
        rule is None
        or rule.approvers is None
        or rule.rule.effect != "require_approval"
        or not rule.enforced
    ):
        return _Refusal(
            f"rule-withdrawn:{approval.rule_id}",
            ApprovalClosed(
                f"rule {approval.rule_id} no longer asks for approval in the current policy "
                f"set (revision {policies.revision[:12]}); approval {approval.approval_id} "
                "cannot be decided, and a resumed call is decided afresh"
            ),
        )
    variables = _variables(plane, approver, approval)
    try:
        allowed = rule.approvers.evaluate(policies.activation(variables))
    except EvaluationError as exc:
        # Fail closed: a condition that cannot be evaluated allows nobody.
        return _Refusal(
            f"approvers-error:{rule.id}: {error_in_words(str(exc), rule.rule.approvers or '')}",
            PermissionDenied(
                f"the approvers condition of rule {rule.id} failed to evaluate for you; "
                "nobody it cannot evaluate may approve"
            ),
        )
    if allowed is not True:
        return _Refusal(
            f"not-an-approver:{rule.id}",
            PermissionDenied(f"you are not among the approvers rule {rule.id} allows"),
        )
    return None


def _variables(plane: Plane, approver: Actor, approval: ApprovalRecord) -> dict[str, Any]:
    requester = (
        json.loads(approval.requester)
        if approval.requester
        else {"id": approval.requester_id, "roles": [], "tenant": approval.tenant, "attrs": {}}
    )
    capability = plane.registry.get(approval.capability_id, approval.capability_version)
    stored = json.loads(approval.input)
    return approver_variables(
        approver=approver.to_cel(),
        requester=requester,
        capability=capability.to_cel()
        if capability
        else {
            "id": approval.capability_id,
            "version": approval.capability_version,
            "service": approval.service,
            "side_effect": "",
            "tags": [],
        },
        input=capability.policy_input(stored) if capability else stored,
    )


def _not_found(approval_id: str) -> NotFound:
    return NotFound(f"approval {approval_id[:64]!r} not found")
