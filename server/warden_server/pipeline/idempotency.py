"""Step 9: idempotency — reserve the key, or answer from what it already holds.

A call with an idempotency key reserves (service, capability, actor, key)
together with its input digest, atomically with its grant. A repeat of the
key, before the reservation expires, is answered without a grant:

============================ ==============================================
the reservation              the repeat gets
============================ ==============================================
another input digest         ``IDEMPOTENCY_CONFLICT``
made under another tenant    ``IDEMPOTENCY_CONFLICT``: never replayed across
completed                    the recorded outcome, replayed (``ctx.replay``)
running, grant still valid   ``OPERATION_IN_PROGRESS`` (retryable)
running, grant expired       ``OUTCOME_UNKNOWN``: the outcome never arrived,
                             the handler may have run; never re-run silently
============================ ==============================================
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from warden_server.pipeline.context import BeginContext
from warden_server.pipeline.failure import Failure, fail
from warden_server.records.events import iso
from warden_server.store import IdempotencyRecord

if TYPE_CHECKING:
    from warden_server.plane import Plane


def idempotency(plane: Plane, ctx: BeginContext) -> Failure | None:
    key = ctx.request.idempotency_key
    if not key:
        return None
    capability, actor = ctx.capability, ctx.actor
    assert capability is not None and actor is not None and ctx.input_digest is not None
    now = iso(ctx.now)
    service = ctx.request.service.name
    held = plane.store.get_idempotency(service, capability.id, actor.id, key)
    if held is not None and now < held.expires_at:
        return _answer_from(plane, ctx, held, now)
    window = timedelta(seconds=plane.config.idempotency.window_seconds)
    ctx.reservation = IdempotencyRecord(
        service=service,
        capability_id=capability.id,
        actor_id=actor.id,
        key=key,
        input_digest=ctx.input_digest,
        invocation_id=ctx.request.invocation_id,
        state="in_progress",
        created_at=now,
        expires_at=iso(ctx.now + window),
    )
    return None


def _answer_from(
    plane: Plane, ctx: BeginContext, held: IdempotencyRecord, now: str
) -> Failure | None:
    first = held.invocation_id
    if held.input_digest != ctx.input_digest:
        return fail("IDEMPOTENCY_CONFLICT", f"idempotency-conflict:{first}")
    invocation = plane.store.get_invocation(first)
    assert ctx.actor is not None
    if invocation is not None and invocation.tenant != ctx.actor.tenant:
        # The same actor id under another tenant's token: the key's outcome
        # was made for that tenant and is never replayed to another (SI-13).
        return fail("IDEMPOTENCY_CONFLICT", f"idempotency-other-tenant:{first}")
    if held.state == "completed":
        ctx.replay = held
        return None
    if invocation is None or now >= invocation.expires_at:
        return fail("OUTCOME_UNKNOWN", f"outcome-never-reported:{first}")
    return fail("OPERATION_IN_PROGRESS", f"in-progress:{first}")


@dataclass(frozen=True, slots=True)
class Replayed:
    """The recorded outcome of a completed call with the same idempotency key."""

    original_invocation_id: str
    status: str
    output_json: str
    """The output as the handler returned it (``succeeded`` only), else empty."""
    failure: Failure | None
    executed_before_failure: bool
    completed_at: datetime


def replayed(plane: Plane, held: IdempotencyRecord) -> Replayed | Failure:
    """The outcome a completed reservation answers with, its output unsealed;
    ``OUTCOME_UNKNOWN`` when the output was sealed under another replay key
    (a restart without one configured)."""
    assert held.status is not None and held.completed_at is not None
    output_json = ""
    if held.status == "succeeded":
        opened = (
            plane.sealer.open(held.sealed_output, replay_binding(held))
            if held.sealed_output is not None
            else None
        )
        if opened is None:
            return fail("OUTCOME_UNKNOWN", f"replay-unreadable:{held.invocation_id}")
        output_json = opened
    face = json.loads(held.failure) if held.failure else None
    return Replayed(
        original_invocation_id=held.invocation_id,
        status=held.status,
        output_json=output_json,
        failure=Failure(
            code=face["code"],
            stage=face["stage"],
            public_message=face["public_message"],
            retryable=face["retryable"],
            exposed=face["exposed"],
            reason="replayed",
            details=face.get("details"),
        )
        if face
        else None,
        executed_before_failure=bool(held.executed_before_failure),
        completed_at=datetime.fromisoformat(held.completed_at),
    )


def replay_binding(record: IdempotencyRecord) -> str:
    """What a sealed output is bound to: exactly this reservation."""
    return "\x1f".join(
        (
            record.service,
            record.capability_id,
            record.actor_id,
            record.key,
            record.input_digest,
            record.invocation_id,
        )
    )


def records_for_replay(status: str, retryable: bool, executed_before_failure: bool) -> bool:
    """Whether an outcome is recorded for replay (True) or the key released.

    A failure that another attempt could fix and that came before the handler
    ran changed nothing, so a repeat may run afresh. Everything else — a
    success, a failure after the handler ran, a failure that would recur — is
    what the key answers from now on.
    """
    return status == "succeeded" or executed_before_failure or not retryable
