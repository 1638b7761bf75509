"""Step 4: conceal what the actor may not see on this surface (SI-8).

An unexposed surface and a matching ``hide`` rule both answer exactly like an
unknown id; the audit log records which it was. Hide rules see no input: they
run before validation, so an invalid input cannot reveal a hidden capability.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warden_server.pipeline.context import BeginContext
from warden_server.pipeline.failure import Failure, not_found

if TYPE_CHECKING:
    from warden_server.plane import Plane


def visibility(plane: Plane, ctx: BeginContext) -> Failure | None:
    assert ctx.capability is not None
    if ctx.request.surface not in ctx.capability.definition.exposure:
        return not_found("unexposed-surface")
    ctx.visibility = ctx.policies.visibility(ctx.capability.id, ctx.base_activation())
    if ctx.visibility.effect == "hide":
        rule = ctx.visibility.rule_id
        return not_found(f"hidden-by-policy:{rule}" if rule else "hide-rule-failed")
    return None
