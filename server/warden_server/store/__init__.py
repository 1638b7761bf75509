"""Persistence behind one interface: the registry, invocations (grants),
approvals and the audit log. SQLite today; PostgreSQL implements the same
protocols when the plane is scaled out."""

from warden_server.store.base import Store, StoreError, WriteTransaction
from warden_server.store.records import (
    ApprovalRecord,
    CapabilityRecord,
    IdempotencyRecord,
    InvocationRecord,
)
from warden_server.store.sqlite import SQLiteStore

__all__ = [
    "ApprovalRecord",
    "CapabilityRecord",
    "IdempotencyRecord",
    "InvocationRecord",
    "SQLiteStore",
    "Store",
    "StoreError",
    "WriteTransaction",
]
