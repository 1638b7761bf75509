"""Begin: pipeline steps 2-9, top to bottom, then one durable decision record.

No grant leaves the plane before its decision record is committed (SI-3).

The steps are a generator (``begin_steps``) that yields each transaction it
needs (``Write``) and goes on with what the store answered: ``begin`` commits
them from a blocking thread, ``abegin`` from a coroutine on the server's event
loop, with one pipeline between the two.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from warden.shared.canonical import compact_json
from warden.shared.redaction import scrub_text, sensitive_texts
from warden_server.approvals.audit import MAX_PRESENTED_ID, approval_event
from warden_server.approvals.events import ApprovalChange
from warden_server.errors import InvalidRequest
from warden_server.grants import GrantClaims
from warden_server.limits import Refusal, admit, epoch
from warden_server.pipeline.approval import approval, record_refused_use
from warden_server.pipeline.authenticate import authenticate
from warden_server.pipeline.authorize import authorize
from warden_server.pipeline.context import BeginContext, BeginRequest
from warden_server.pipeline.failure import Failure, already_used, fail
from warden_server.pipeline.idempotency import Replayed, idempotency, replayed
from warden_server.pipeline.limits import limited, limits
from warden_server.pipeline.policy import policy
from warden_server.pipeline.resolve import resolve
from warden_server.pipeline.validate import validate
from warden_server.pipeline.visibility import visibility
from warden_server.policy.engine import would_have
from warden_server.records.events import AuditEvent, iso
from warden_server.store import (
    ApprovalRecord,
    IdempotencyRecord,
    InvocationRecord,
    StoreError,
    WriteTransaction,
)

if TYPE_CHECKING:
    from warden_server.plane import Plane

Stage = Callable[["Plane", BeginContext], Failure | None]

# Two stages run out of the SPEC's numbering. The actor is authenticated
# before the capability is resolved: the other way round, a caller without a
# valid token would learn which ids exist (UNAUTHENTICATED for those,
# CAPABILITY_NOT_FOUND for the rest), which SI-8 forbids. And an idempotency
# key is looked up before limits and approval: a repeat of a completed call is
# answered with its recorded outcome (SPEC §8), which spends nothing and needs
# no second approval; the rules still decide whether the caller may have it.
STAGES: tuple[Stage, ...] = (
    authenticate,
    resolve,
    visibility,
    validate,
    authorize,
    policy,
    idempotency,
    limits,
    approval,
)


class InvocationIdReused(InvalidRequest):
    """A decision was already recorded for this invocation id (by this call's
    twin in another thread or process, or long ago): ids are good for one."""

    def __init__(self, invocation_id: str) -> None:
        super().__init__(f"invocation_id {invocation_id} was already used")


def _claim(tx: WriteTransaction, invocation_id: str) -> None:
    if not tx.claim_invocation(invocation_id):
        raise InvocationIdReused(invocation_id)


class ApprovalAlreadyUsed(Exception):
    """Two resumes raced for one approval; this one lost."""


class KeyAlreadyReserved(Exception):
    """Two calls raced for one idempotency key; this one lost."""


class LimitReached(Exception):
    """A limit had room when the stage looked, and none when the grant was
    written: another call (perhaps in another process) took it first."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.limit_id)
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class Granted:
    token: str
    capability_version: str
    input_json: str
    input_digest: str
    timeout_ms: int
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class BeginResult:
    """What Begin answers: exactly one of grant, failure or replay (a
    suspension is a failure with code APPROVAL_REQUIRED and an approval id)."""

    invocation_id: str
    policy_revision: str
    context: BeginContext
    grant: Granted | None = None
    failure: Failure | None = None
    replay: Replayed | None = None
    approval_id: str | None = None
    approval_expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Write:
    """A transaction Begin needs durable before it goes on (SI-3)."""

    work: Callable[[WriteTransaction], Any]
    deadline: float | None = None


Steps = Generator[Write, Any, BeginResult]
"""Begin's steps: each ``Write`` yielded is answered with what its work
returned, or has what it raised thrown in."""


def begin(plane: Plane, request: BeginRequest) -> BeginResult:
    """Begin from a thread that may block while its record commits."""
    steps = begin_steps(plane, request)
    step = _resume(steps)
    while isinstance(step, Write):
        try:
            written = plane.store.transact(step.work, deadline=step.deadline)
        except Exception as exc:
            step = _resume(steps, failed=exc)
        else:
            step = _resume(steps, written)
    return step


async def abegin(plane: Plane, request: BeginRequest) -> BeginResult:
    """Begin from a coroutine: the same steps, the commits awaited."""
    steps = begin_steps(plane, request)
    step = _resume(steps)
    while isinstance(step, Write):
        try:
            written = await plane.store.atransact(step.work, deadline=step.deadline)
        except Exception as exc:
            step = _resume(steps, failed=exc)
        else:
            step = _resume(steps, written)
    return step


def _resume(
    steps: Steps, written: Any = None, failed: Exception | None = None
) -> Write | BeginResult:
    """Begin's next write, or its result: the steps go on with what the last
    write returned, or with what it raised."""
    try:
        return steps.throw(failed) if failed is not None else steps.send(written)
    except StopIteration as done:
        result: BeginResult = done.value
        return result


def begin_steps(plane: Plane, request: BeginRequest) -> Steps:
    ctx = BeginContext(request=request, policies=plane.policies.current(), now=plane.clock())
    for stage in STAGES:
        if time.monotonic() > request.deadline:
            late = fail("GOVERNANCE_UNAVAILABLE", "plane-deadline-exceeded")
            return (yield from _refuse(plane, ctx, late))
        failure = plane.telemetry.run_stage(stage, plane, ctx)
        if failure is not None:
            return (yield from _refuse(plane, ctx, failure))
        if ctx.replay is not None:
            return (yield from _replay(plane, ctx, ctx.replay))
    refusal: Failure
    try:
        return (yield from _grant(plane, ctx))
    except ApprovalAlreadyUsed:
        refusal = already_used()
    except LimitReached as exc:
        ctx.limited = [exc.refusal.to_json()]
        refusal = limited(exc.refusal)
    except KeyAlreadyReserved:
        # Another call took the key between this one's read and its write;
        # answer as the idempotency stage now does.
        ctx.reservation = None
        raced = idempotency(plane, ctx)
        if ctx.replay is not None:
            return (yield from _replay(plane, ctx, ctx.replay))
        refusal = raced or fail("OPERATION_IN_PROGRESS", "reservation-raced")
    except StoreError:
        if time.monotonic() <= request.deadline:
            raise
        refusal = fail("GOVERNANCE_UNAVAILABLE", "plane-deadline-exceeded")
    return (yield from _refuse(plane, ctx, refusal))


def _grant(plane: Plane, ctx: BeginContext) -> Steps:
    capability, actor, request = ctx.capability, ctx.actor, ctx.request
    assert capability is not None and actor is not None and ctx.input_digest is not None
    timeout_ms = capability.definition.timeout_ms or plane.config.server.default_timeout_ms
    if request.timeout_ms:
        timeout_ms = min(timeout_ms, request.timeout_ms)
    expires = ctx.now + timedelta(milliseconds=timeout_ms, seconds=plane.config.grants.ttl_seconds)
    invocation = InvocationRecord(
        invocation_id=request.invocation_id,
        service=request.service.name,
        capability_id=capability.id,
        capability_version=capability.version,
        actor_id=actor.id,
        tenant=actor.tenant,
        surface=request.surface,
        input_digest=ctx.input_digest,
        state="granted",
        granted_at=iso(ctx.now),
        expires_at=iso(expires),
        call_id=request.call_id,
        attempt=request.attempt,
    )
    reservation = ctx.reservation
    counted = ctx.limits.calls if ctx.limits is not None else ()
    # Built here, not in the store's writer, whose time every process waits for.
    decided = _decision_event(plane, ctx, "granted", None)

    consumed = False

    def work(tx: WriteTransaction) -> None:
        nonlocal consumed
        _claim(tx, request.invocation_id)
        if ctx.consume_approval:
            assert ctx.approval is not None
            if not tx.consume_approval(ctx.approval.approval_id, iso(ctx.now)):
                raise ApprovalAlreadyUsed
            tx.append_audit(_approval_event(ctx, "consumed", ctx.approval))
            consumed = True
        elif ctx.approval_superseded:
            assert ctx.approval is not None
            if tx.consume_approval(ctx.approval.approval_id, iso(ctx.now), pending_too=True):
                tx.append_audit(_approval_event(ctx, "consumed", ctx.approval))
                consumed = True
        if reservation is not None and not tx.reserve_idempotency(reservation, iso(ctx.now)):
            raise KeyAlreadyReserved
        ctx.limited = []
        if counted:
            admission = admit(
                tx,
                counted,
                invocation_id=request.invocation_id,
                now=epoch(ctx.now),
                grant_expires=epoch(expires),
            )
            if admission.refusal is not None:
                raise LimitReached(admission.refusal)
            ctx.limited = [{**r.to_json(), "mode": "audit"} for r in admission.would_have]
        tx.insert_invocation(invocation)
        # What a limit in audit mode would have refused is known only now.
        tx.append_audit(
            dataclasses.replace(decided, rules=_rules_json(ctx)) if ctx.limited else decided
        )

    # A grant is never committed once its requester has stopped waiting for it.
    yield Write(work, deadline=request.deadline)
    if consumed:
        assert ctx.approval is not None
        used = dataclasses.replace(ctx.approval, state="consumed")
        plane.approval_events.publish([ApprovalChange("consumed", used)])
    token = plane.grants.sign(
        GrantClaims(
            invocation_id=request.invocation_id,
            capability_id=capability.id,
            capability_version=capability.version,
            service=request.service.name,
            actor_id=actor.id,
            input_digest=ctx.input_digest,
            expires_at=int(expires.timestamp()),
        ),
        now=ctx.now.timestamp(),
    )
    return BeginResult(
        invocation_id=request.invocation_id,
        policy_revision=ctx.policies.revision,
        context=ctx,
        grant=Granted(
            token=token,
            capability_version=capability.version,
            input_json=compact_json(ctx.input),
            input_digest=ctx.input_digest,
            timeout_ms=timeout_ms,
            expires_at=expires,
        ),
    )


def _replay(plane: Plane, ctx: BeginContext, held: IdempotencyRecord) -> Steps:
    """Answer with the recorded outcome of the call that holds the key."""
    answer = replayed(plane, held)
    if isinstance(answer, Failure):
        return (yield from _refuse(plane, ctx, answer))
    reason = f"idempotent-replay:{held.invocation_id}"
    event = _decision_event(plane, ctx, "replayed", None, reason=reason)

    def work(tx: WriteTransaction) -> None:
        _claim(tx, ctx.request.invocation_id)
        tx.append_audit(event)

    yield Write(work)
    return BeginResult(
        invocation_id=ctx.request.invocation_id,
        policy_revision=ctx.policies.revision,
        context=ctx,
        replay=answer,
    )


def _refuse(plane: Plane, ctx: BeginContext, failure: Failure) -> Steps:
    suspended = failure.code == "APPROVAL_REQUIRED"
    expires: datetime | None = ctx.extra.get("approval_expires_at")
    event = _decision_event(plane, ctx, "suspended" if suspended else "failed", failure)
    record = _approval_record(plane, ctx, expires) if suspended and expires is not None else None

    def work(tx: WriteTransaction) -> list[ApprovalChange]:
        _claim(tx, ctx.request.invocation_id)
        tx.append_audit(event)
        changes = record_refused_use(tx, ctx, failure)
        if record is not None:
            tx.insert_approval(record)
            tx.append_audit(_approval_event(ctx, "requested", record))
            changes.append(ApprovalChange("requested", record))
        return changes

    plane.approval_events.publish((yield Write(work)))
    if suspended and expires is None and failure.details:
        expires = datetime.fromisoformat(failure.details["expires_at"])
    return BeginResult(
        invocation_id=ctx.request.invocation_id,
        policy_revision=ctx.policies.revision,
        context=ctx,
        failure=failure,
        approval_id=ctx.approval_id if suspended else None,
        approval_expires_at=expires if suspended else None,
    )


def _approval_record(plane: Plane, ctx: BeginContext, expires: datetime) -> ApprovalRecord:
    capability, actor, decision = ctx.capability, ctx.actor, ctx.decision
    assert capability and actor and decision and decision.rule and ctx.approval_id
    assert ctx.input_digest is not None
    return ApprovalRecord(
        approval_id=ctx.approval_id,
        capability_id=capability.id,
        capability_version=capability.version,
        service=ctx.request.service.name,
        requester_id=actor.id,
        tenant=actor.tenant,
        input_digest=ctx.input_digest,
        input=compact_json(plane.redaction.value(ctx.input, capability.definition.input_schema)),
        rule_id=decision.rule.id,
        message=decision.message or "",
        approvers=decision.rule.rule.approvers or "true",
        state="pending",
        created_at=iso(ctx.now),
        expires_at=iso(expires),
        invocation_id=ctx.request.invocation_id,
        policy_revision=ctx.policies.revision,
        requester=compact_json(actor.to_cel()),
    )


def _decision_event(
    plane: Plane,
    ctx: BeginContext,
    status: str,
    failure: Failure | None,
    *,
    reason: str | None = None,
) -> AuditEvent:
    request, capability, actor = ctx.request, ctx.capability, ctx.actor
    if reason is None:
        reason = (
            failure.reason
            if failure
            else ("approval-consumed" if ctx.consume_approval else "granted")
        )
    return AuditEvent(
        kind="decision",
        status=status,
        invocation_id=request.invocation_id,
        capability_id=request.capability_id,
        capability_version=capability.version if capability else request.capability_version,
        service=request.service.name,
        actor_id=actor.id if actor else None,
        tenant=actor.tenant if actor else None,
        surface=request.surface,
        stage=failure.stage if failure else None,
        code=failure.code if failure else None,
        exposed=failure.exposed if failure else None,
        retryable=failure.retryable if failure else None,
        public_message=failure.public_message if failure else None,
        policy_revision=ctx.policies.revision,
        rules=_rules_json(ctx),
        # The approval the call presented, even when a stage before approval
        # refused it (a limit), or the one its suspension asked for.
        approval_id=ctx.approval_id or request.approval_id[:MAX_PRESENTED_ID] or None,
        input_digest=ctx.input_digest,
        input=_redacted_input(plane, ctx),
        reason=reason,
        details=compact_json(failure.details) if failure and failure.details else None,
        call_id=request.call_id,
        attempt=request.attempt,
    )


def _approval_event(ctx: BeginContext, status: str, record: ApprovalRecord) -> AuditEvent:
    return approval_event(
        status,
        record.approval_id,
        record,
        actor=ctx.actor,
        policy_revision=ctx.policies.revision,
        invocation_id=ctx.request.invocation_id,
        surface=ctx.request.surface,
    )


def _rules_json(ctx: BeginContext) -> str | None:
    results: list[dict[str, Any]] = []
    for decision in (ctx.visibility, ctx.decision):
        if decision is not None:
            results.extend(decision.rules_json())
    deciding = ctx.decision.rule_id if ctx.decision else None
    hiding = ctx.visibility.rule_id if ctx.visibility else None
    limits = _limits_json(ctx)
    if not results and not deciding and not hiding and limits is None:
        return None
    errors = ("error", "message_error")
    if ctx.capability is not None and any(key in r for r in results for key in errors):
        # A CEL error message may quote the input it failed on (SI-5).
        secrets = sensitive_texts(ctx.input, ctx.capability.definition.input_schema)
        for result in results:
            for key in errors:
                if key in result:
                    result[key] = scrub_text(result[key], secrets)
    recorded: dict[str, Any] = {"decided_by": hiding or deciding, "evaluated": results}
    if limits is not None:
        recorded["limits"] = limits
    shadow = would_have(ctx.visibility, ctx.decision) if ctx.visibility else None
    if shadow is not None:
        recorded["would_have"] = shadow.outcome_json()
    return compact_json(recorded)


def _limits_json(ctx: BeginContext) -> dict[str, Any] | None:
    """What the call counted against each limit, and which limit refused it
    (or would have, in audit mode); None when no limit matched the call."""
    counted = ctx.limits
    if counted is None or not (counted.calls or counted.errors or counted.skipped):
        return None
    # A key or an error may quote sensitive input (SI-5).
    secrets = (
        sensitive_texts(ctx.input, ctx.capability.definition.input_schema)
        if ctx.capability is not None
        else frozenset()
    )
    recorded: dict[str, Any] = {
        "counted": [
            {"id": c.limit.id, "key": scrub_text(c.key, secrets), "cost": c.cost}
            for c in counted.calls
        ],
        "skipped": list(counted.skipped),
        "errors": [
            {"id": limit_id, "error": scrub_text(error, secrets)}
            for limit_id, error in counted.errors
        ],
    }
    if ctx.limited:
        recorded["limited"] = ctx.limited
    return recorded


def _redacted_input(plane: Plane, ctx: BeginContext) -> str | None:
    """The input as stored: only once parsed, and only with a schema to redact by.

    Without a known capability there is no way to know which fields are
    sensitive, so such input is not stored at all.
    """
    capability = ctx.capability
    if capability is None or ctx.input is None:
        return None
    if not capability.sensitive_input:
        return compact_json(ctx.input)
    return compact_json(plane.redaction.value(ctx.input, capability.definition.input_schema))


def reject(
    plane: Plane,
    *,
    reason: str,
    invocation_id: str = "",
    capability_id: str = "",
    service: str | None = None,
    surface: str = "",
) -> Write:
    """The record of a Begin the plane refused to decode (SI-3), to commit.

    Its id, when it has one, is spent too: it cannot be decided later.
    """
    event = rejection(
        plane,
        reason=reason,
        invocation_id=invocation_id,
        capability_id=capability_id,
        service=service,
        surface=surface,
    )

    def work(tx: WriteTransaction) -> None:
        if invocation_id:
            tx.claim_invocation(invocation_id)
        tx.append_audit(event)

    return Write(work)


def rejection(
    plane: Plane,
    *,
    reason: str,
    invocation_id: str = "",
    capability_id: str = "",
    service: str | None = None,
    surface: str = "",
) -> AuditEvent:
    """The record of a Begin the plane refused before any stage ran."""
    return AuditEvent(
        kind="decision",
        status="rejected",
        invocation_id=invocation_id or None,
        capability_id=capability_id or None,
        service=service,
        surface=surface or None,
        policy_revision=plane.policies.current().revision,
        reason=reason[:1000],
    )
