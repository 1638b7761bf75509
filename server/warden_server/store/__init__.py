"""Persistence behind interfaces of their own: the registry, invocations
(grants), approvals, idempotency keys and the audit log (writing and
queries). The only package that speaks SQL."""

from warden_server.store.base import (
    AuditQueries,
    Store,
    StoreError,
    StoreUnreadable,
    WriteTransaction,
)
from warden_server.store.records import (
    ApprovalRecord,
    CapabilityRecord,
    IdempotencyRecord,
    InvocationRecord,
)
from warden_server.store.sqlite import SQLiteStore

__all__ = [
    "ApprovalRecord",
    "AuditQueries",
    "CapabilityRecord",
    "IdempotencyRecord",
    "InvocationRecord",
    "SQLiteStore",
    "Store",
    "StoreError",
    "StoreUnreadable",
    "WriteTransaction",
]
