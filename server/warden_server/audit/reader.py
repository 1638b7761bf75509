"""Reading the audit log: verification of the chain and filtered queries."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from warden_server.audit.chain import VerifyResult, verify_rows
from warden_server.store import Store


def verify(store: Store) -> VerifyResult:
    """Walk the whole chain and name the first bad sequence number (SI-4)."""
    return verify_rows(store.audit_rows(order="seq"))


@dataclass(frozen=True, slots=True)
class AuditFilter:
    since: str | None = None
    until: str | None = None
    capability: str | None = None
    actor: str | None = None
    tenant: str | None = None
    stage: str | None = None
    code: str | None = None
    status: str | None = None
    kind: str | None = None
    invocation: str | None = None
    limit: int = 100


def query(store: Store, f: AuditFilter) -> Iterator[dict[str, Any]]:
    """Matching records, newest first."""
    clauses = []
    params: dict[str, Any] = {}
    exact = {
        "actor_id": f.actor,
        "tenant": f.tenant,
        "stage": f.stage,
        "code": f.code,
        "status": f.status,
        "kind": f.kind,
        "invocation_id": f.invocation,
    }
    for column, value in exact.items():
        if value is not None:
            clauses.append(f"{column} = :{column}")
            params[column] = value
    if f.capability is not None:
        clauses.append("capability_id GLOB :capability")
        params["capability"] = f.capability
    if f.since is not None:
        clauses.append("ts >= :since")
        params["since"] = f.since
    if f.until is not None:
        clauses.append("ts < :until")
        params["until"] = f.until
    return store.audit_rows(" AND ".join(clauses), params, order="seq DESC", limit=f.limit)
