"""Who may read the audit log, and the record of every read (SI-13).

Readers are actors with the role ``auditor``; they see the records of their
own tenant unless they also hold ``auditor:all``. Reading every tenant's
records at once (verifying the whole chain) needs ``auditor:all``. Every
attempt, allowed or not, is committed to the log as an ``access`` record
before it is answered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from warden.shared.canonical import compact_json
from warden_server.audit.events import AuditEvent
from warden_server.audit.reader import AuditFilter, Scope
from warden_server.auth.actors import Actor, AuthenticationError
from warden_server.errors import PermissionDenied

if TYPE_CHECKING:
    from warden_server.plane import Plane

AUDITOR: Final = "auditor"
AUDITOR_ALL: Final = "auditor:all"


def scope_of(actor: Actor, *, every_tenant: bool = False) -> Scope:
    """The tenants ``actor`` may read.

    Raises:
        PermissionDenied: not an auditor, an auditor without a tenant, or
            ``every_tenant`` asked of an auditor confined to one.
    """
    roles = set(actor.roles)
    if AUDITOR_ALL in roles:
        return None
    if AUDITOR not in roles:
        raise PermissionDenied(f"reading the audit log needs the role {AUDITOR}")
    if every_tenant:
        raise PermissionDenied(f"this reads every tenant's records and needs {AUDITOR_ALL}")
    if not actor.tenant:
        raise PermissionDenied(f"an {AUDITOR} without a tenant needs {AUDITOR_ALL}")
    return frozenset({actor.tenant})


def authorize_read(
    plane: Plane,
    authenticate: Callable[[], Actor],
    action: str,
    audit_filter: AuditFilter | None = None,
    *,
    every_tenant: bool = False,
    **request: Any,
) -> Scope:
    """Authenticate and authorize an audit read, and record it (allowed or not).

    Args:
        authenticate: Verifies the caller's actor JWT.
        action: What is read: ``query``, ``stats``, ``verify`` or ``export``.
        audit_filter: The read's filter; a tenant outside the caller's scope is refused.
        every_tenant: The read spans every tenant (needs ``auditor:all``).
        request: Further request fields to record (a grouping, a page size).

    Returns:
        The scope to read with.

    Raises:
        AuthenticationError: no valid actor token.
        PermissionDenied: see ``scope_of``, or a tenant outside the scope.
    """
    asked = {
        **(audit_filter.to_json() if audit_filter else {}),
        **{key: value for key, value in request.items() if value is not None},
    }
    try:
        actor = authenticate()
    except AuthenticationError as exc:
        _record(plane, action, asked, None, "rejected", ("UNAUTHENTICATED", str(exc)))
        raise
    try:
        scope = scope_of(actor, every_tenant=every_tenant)
        tenant = audit_filter.tenant if audit_filter else None
        if scope is not None and tenant is not None and tenant not in scope:
            raise PermissionDenied(f"{actor.id} may read tenant {actor.tenant!r} only")
    except PermissionDenied as exc:
        _record(plane, action, asked, actor, "denied", ("FORBIDDEN", str(exc)))
        raise
    _record(plane, action, asked, actor, "allowed", None)
    return scope


def _record(
    plane: Plane,
    action: str,
    asked: dict[str, Any],
    actor: Actor | None,
    status: str,
    refusal: tuple[str, str] | None,
) -> None:
    code, why = refusal if refusal else (None, None)
    event = AuditEvent(
        kind="access",
        status=status,
        actor_id=actor.id if actor else None,
        tenant=actor.tenant if actor else None,
        surface="audit-api",
        stage={"UNAUTHENTICATED": "authentication", "FORBIDDEN": "authorization"}.get(code or ""),
        code=code,
        input=compact_json(asked),
        reason=f"audit.{action}" + (f": {why}" if why else ""),
    )
    plane.store.transact(lambda tx: tx.append_audit(event))
