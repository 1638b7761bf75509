"""Role checks for the administrative APIs (policy status, and the like)."""

from __future__ import annotations

from collections.abc import Iterable

from warden_server.auth.actors import Actor
from warden_server.errors import PermissionDenied

POLICY_READERS = frozenset({"policy-author", "auditor", "auditor:all"})
"""Roles that may read the policy status and the schemas policies are checked against."""


def require_any_role(actor: Actor, roles: Iterable[str], action: str) -> None:
    """Raise ``PermissionDenied`` unless the actor holds one of ``roles``.

    Raises:
        PermissionDenied: the actor holds none of them.
    """
    wanted = sorted(roles)
    if not set(actor.roles) & set(wanted):
        raise PermissionDenied(f"{action} needs one of the roles {', '.join(wanted)}")
