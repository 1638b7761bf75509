"""Step 3: authenticate the actor the call is made for. The plane runs it
first, before step 2 resolves the id (see ``begin.STAGES``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from warden_server.auth.actors import AuthenticationError
from warden_server.pipeline.context import BeginContext
from warden_server.pipeline.failure import Failure, fail

if TYPE_CHECKING:
    from warden_server.plane import Plane


def authenticate(plane: Plane, ctx: BeginContext) -> Failure | None:
    try:
        ctx.actor = plane.actors.verify(ctx.request.actor_token)
    except AuthenticationError as exc:
        return fail("UNAUTHENTICATED", str(exc))
    return None
