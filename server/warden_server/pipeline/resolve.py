"""Step 2: resolve the capability id (and version) the call names. It runs
after step 3, so that a caller without a valid token cannot tell which ids
exist (SI-8)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from warden_server.pipeline.context import BeginContext
from warden_server.pipeline.failure import Failure, not_found
from warden_server.registry import is_capability_id

if TYPE_CHECKING:
    from warden_server.plane import Plane


def resolve(plane: Plane, ctx: BeginContext) -> Failure | None:
    request = ctx.request
    if not is_capability_id(request.capability_id):
        return not_found("malformed-capability-id")
    capability = plane.registry.get(request.capability_id, request.capability_version)
    if capability is None:
        known = request.capability_version and plane.registry.get(request.capability_id)
        return not_found("unknown-version" if known else "unknown-capability")
    if not request.service.owns(capability.id):
        return not_found(f"not-owned-by-service:{request.service.name}")
    ctx.capability = capability
    return None
