"""Step 7b: policy limits — after the rules allowed a call, before approval.

The stage works out what the call counts against each limit (its key and
cost) and refuses it early when a limit is already full, so that a call
over its limit raises no approval request. What it counts is taken only
with the grant, in the grant's transaction (``begin._grant``): a call that
needs approval reserves nothing until it is granted, and of two processes
racing for the last token, one wins.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from warden.shared.redaction import sensitive_texts
from warden_server.limits import Refusal, epoch, judge, strongest
from warden_server.pipeline.context import BeginContext
from warden_server.pipeline.failure import Failure, fail
from warden_server.policy.engine import LimitsOutcome

if TYPE_CHECKING:
    from warden_server.plane import Plane


def limits(plane: Plane, ctx: BeginContext) -> Failure | None:
    assert ctx.capability is not None
    if not ctx.policies.limits:
        return None
    activation = ctx.with_input()
    counted = _stored_keys(plane, ctx, ctx.policies.count(ctx.capability.id, activation))
    ctx.limits = counted
    broken = [
        limit_id
        for limit_id, _ in counted.errors
        if (found := ctx.policies.limit(limit_id)) is not None and found.enforced
    ]
    if broken:
        return fail("POLICY_FAILED", "limit-error:" + ",".join(broken))
    enforced = [call for call in counted.calls if call.limit.enforced]
    if not enforced:
        return None
    now = epoch(ctx.now)
    refusals = []
    for call in enforced:
        usage = plane.store.limit_usages(call.limit.id, call.key, now)[0]
        refusal = judge(call, usage, now)
        if refusal is not None:
            refusals.append(refusal)
    if not refusals:
        return None
    refusal = strongest(refusals)
    ctx.limited = [refusal.to_json()]
    return limited(refusal)


def _stored_keys(plane: Plane, ctx: BeginContext, counted: LimitsOutcome) -> LimitsOutcome:
    """Keys as the store may keep them: a key that is, or holds, a sensitive
    input value (``"card-" + input.card``) is counted by its stored form
    (``[redaction]``), never in clear (SI-5)."""
    assert ctx.capability is not None
    if not counted.calls or not ctx.capability.sensitive_input:
        return counted
    secrets = sensitive_texts(ctx.input, ctx.capability.definition.input_schema)
    calls = tuple(
        replace(call, key=str(plane.redaction.replacement(call.key)))
        if any(secret in call.key for secret in secrets)
        else call
        for call in counted.calls
    )
    return replace(counted, calls=calls)


def limited(refusal: Refusal) -> Failure:
    """The public face of a refusal: the limit's message, and when to retry;
    a call over the whole budget is a denial (no wait helps)."""
    limit = refusal.call.limit
    if refusal.never:
        return fail("POLICY_DENIED", f"over-whole-budget:{limit.id}", message=limit.limit.message)
    return fail(
        "RATE_LIMITED",
        f"limited-by:{limit.id}",
        message=limit.limit.message,
        details={"retry_after_ms": refusal.retry_after_ms},
    )
