"""Step 7: evaluate the CEL policies; fail closed on any error."""

from __future__ import annotations

from typing import TYPE_CHECKING

from warden_server.pipeline.context import BeginContext
from warden_server.pipeline.failure import Failure, fail

if TYPE_CHECKING:
    from warden_server.plane import Plane


def policy(plane: Plane, ctx: BeginContext) -> Failure | None:
    assert ctx.capability is not None
    activation = ctx.with_input()
    decision = ctx.policies.decide(ctx.capability.id, activation)
    ctx.decision = decision
    if decision.effect == "error":
        broken = [r.rule_id for r in decision.results if r.error]
        return fail("POLICY_FAILED", "policy-error:" + ",".join(broken))
    if decision.effect == "deny":
        reason = f"denied-by-rule:{decision.rule_id}" if decision.rule else "default-deny"
        return fail("POLICY_DENIED", reason, message=decision.message)
    return None
