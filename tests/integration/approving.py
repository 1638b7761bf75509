"""What the approval tests share: an injectable clock, approvers, a held store writer."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import warden
from tests.conftest import Plant
from warden_server.store import SQLiteStore


class Clock:
    """A clock the test moves by hand; the plane reads it through ``Plane.clock``."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def install_clock(plant: Plant) -> Clock:
    clock = Clock()
    plant.server.plane.clock = clock
    return clock


@contextmanager
def approver(plant: Plant, sub: str = "mia", **claims: Any) -> Iterator[warden.Approvals]:
    """An SDK client acting as ``sub`` (a manager of acme unless told otherwise)."""
    claims.setdefault("roles", ("manager",))
    client = warden.Approvals(plant.target, token=plant.token(sub=sub, **claims))
    try:
        yield client
    finally:
        client.close()


@contextmanager
def held_writer(store: SQLiteStore) -> Iterator[None]:
    """Hold the store's writers' lock until the block ends, as another
    process's writer in the middle of its turn would: the transactions
    submitted meanwhile wait, and then commit as one batch."""
    turns = os.open(f"{store.path}.writer-lock", os.O_RDWR)
    fcntl.flock(turns, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(turns, fcntl.LOCK_UN)
        os.close(turns)


def approval_rows(plant: Plant, approval_id: str) -> list[dict[str, Any]]:
    return plant.rows(
        "SELECT * FROM audit_events WHERE kind = 'approval' AND approval_id = ? ORDER BY seq",
        (approval_id,),
    )
