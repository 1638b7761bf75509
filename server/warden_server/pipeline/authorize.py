"""Step 6: authorize — the actor must hold every role the capability requires."""

from __future__ import annotations

from typing import TYPE_CHECKING

from warden_server.pipeline.context import BeginContext
from warden_server.pipeline.failure import Failure, fail

if TYPE_CHECKING:
    from warden_server.plane import Plane


def authorize(plane: Plane, ctx: BeginContext) -> Failure | None:
    assert ctx.capability is not None and ctx.actor is not None
    missing = sorted(set(ctx.capability.definition.required_roles) - set(ctx.actor.roles))
    if missing:
        return fail("FORBIDDEN", "missing-roles:" + ",".join(missing))
    return None
