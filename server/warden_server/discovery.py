"""Discovery: what an actor may see on a surface, through the calling service.

Hidden capabilities are simply absent, exactly like unknown ones (SI-8), and a
service sees only the capabilities it owns: the ones Begin would let it run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from warden_server.auth.actors import Actor
from warden_server.auth.services import Service
from warden_server.plane import Plane
from warden_server.policy.variables import decision_variables
from warden_server.registry import Capability


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is looking: a service on behalf of an actor, on one surface."""

    service: Service
    actor: Actor
    surface: str
    context: dict[str, Any]


def visible(plane: Plane, viewer: Viewer, capability: Capability) -> bool:
    if not viewer.service.owns(capability.id):
        return False
    if viewer.surface not in capability.definition.exposure:
        return False
    policies = plane.policies.current()
    activation = policies.activation(
        decision_variables(
            actor=viewer.actor.to_cel(),
            capability=capability.to_cel(),
            context=viewer.context,
            surface=viewer.surface,
            now=plane.clock(),
        )
    )
    return policies.visibility(capability.id, activation).effect != "hide"


def list_visible(plane: Plane, viewer: Viewer) -> list[Capability]:
    # Only the calling service's namespaces are read: its discovery costs the
    # same however many capabilities other services register.
    own = plane.registry.latest(viewer.service.namespaces)
    return [c for c in own if visible(plane, viewer, c)]


def get_visible(
    plane: Plane, viewer: Viewer, capability_id: str, version: str
) -> Capability | None:
    capability = plane.registry.get(capability_id, version)
    if capability is None or not visible(plane, viewer, capability):
        return None
    return capability
