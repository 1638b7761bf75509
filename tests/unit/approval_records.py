"""Approval records for the unit tests."""

from __future__ import annotations

import dataclasses
from typing import Any

from warden_server.store import ApprovalRecord

CREATED = "2026-01-01T00:00:00.000Z"
EXPIRES = "2026-01-01T01:00:00.000Z"


def pending(approval_id: str = "a1", **changes: Any) -> ApprovalRecord:
    """A pending approval of tenant acme, open for the first hour of 2026."""
    record = ApprovalRecord(
        approval_id=approval_id,
        capability_id="orders.refund",
        capability_version="1",
        service="orders",
        requester_id="bot-7",
        tenant="acme",
        input_digest="sha256:0",
        input="{}",
        rule_id="r",
        message="",
        approvers="true",
        state="pending",
        created_at=CREATED,
        expires_at=EXPIRES,
    )
    return dataclasses.replace(record, **changes)
