"""Discovery: what an actor may see on a surface. Hidden capabilities are
simply absent, exactly like unknown ones (SI-8)."""

from __future__ import annotations

from typing import Any

from warden_server.auth.actors import Actor
from warden_server.plane import Plane
from warden_server.policy.variables import decision_variables
from warden_server.registry import Capability


def visible(
    plane: Plane, capability: Capability, actor: Actor, surface: str, context: dict[str, Any]
) -> bool:
    if surface not in capability.definition.exposure:
        return False
    policies = plane.policies.current()
    activation = policies.activation(
        decision_variables(
            actor=actor.to_cel(),
            capability=capability.to_cel(),
            context=context,
            surface=surface,
            now=plane.clock(),
        )
    )
    return policies.visibility(capability.id, activation).effect != "hide"


def list_visible(
    plane: Plane, actor: Actor, surface: str, context: dict[str, Any]
) -> list[Capability]:
    return [c for c in plane.registry.latest() if visible(plane, c, actor, surface, context)]


def get_visible(
    plane: Plane,
    capability_id: str,
    version: str,
    actor: Actor,
    surface: str,
    context: dict[str, Any],
) -> Capability | None:
    capability = plane.registry.get(capability_id, version)
    if capability is None or not visible(plane, capability, actor, surface, context):
        return None
    return capability
