"""Expiry: an approval whose time is up can be neither decided nor used.

Every use and every decision checks the time itself, so expiry never depends
on a background task. The sweeper only makes it visible: it marks due
approvals ``expired``, records the transition and tells watchers.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from datetime import datetime
from typing import TYPE_CHECKING

from warden_server.approvals.audit import approval_event
from warden_server.approvals.events import ApprovalChange
from warden_server.records.events import iso
from warden_server.store import ApprovalRecord, WriteTransaction

if TYPE_CHECKING:
    from warden_server.plane import Plane

log = logging.getLogger(__name__)
OPEN_STATES = ("pending", "approved")
"""The states expiry ends; the others are final already."""


def is_due(approval: ApprovalRecord, now: datetime) -> bool:
    """Whether the approval is open but its time is up."""
    return approval.state in OPEN_STATES and now >= datetime.fromisoformat(approval.expires_at)


def as_of(approval: ApprovalRecord, now: datetime) -> ApprovalRecord:
    """The approval as it stands at ``now``: ``expired`` once due, even before
    the sweeper has written it."""
    return dataclasses.replace(approval, state="expired") if is_due(approval, now) else approval


def expire(
    tx: WriteTransaction, approval: ApprovalRecord, now: datetime, policy_revision: str
) -> ApprovalChange | None:
    """Mark one due approval expired and record it, in the caller's transaction;
    None if it was not (or no longer) due."""
    if not tx.expire_approval(approval.approval_id, iso(now)):
        return None
    tx.append_audit(
        approval_event(
            "expired",
            approval.approval_id,
            approval,
            actor=None,
            policy_revision=policy_revision,
            details={"from": approval.state},
        )
    )
    return ApprovalChange("expired", dataclasses.replace(approval, state="expired"))


def expire_due(plane: Plane, batch: int = 500) -> list[ApprovalChange]:
    """Expire every approval whose time is up by the plane's clock, tell the
    watchers, and return what expired."""
    now = plane.clock()
    revision = plane.policies.current().revision
    expired: list[ApprovalChange] = []
    while True:

        def work(tx: WriteTransaction) -> list[ApprovalChange]:
            changes = (expire(tx, a, now, revision) for a in tx.due_approvals(iso(now), batch))
            return [c for c in changes if c is not None]

        changes = plane.store.transact(work)
        plane.approval_events.publish(changes)
        expired.extend(changes)
        if len(changes) < batch:
            return expired


class Sweeper:
    """Runs ``expire_due`` every ``interval`` seconds on a daemon thread."""

    def __init__(self, plane: Plane, interval: float) -> None:
        self._plane = plane
        self._interval = interval
        self.sweeps = 0
        """How many sweeps this plane ran: none unless it leads."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="warden-approval-sweeper", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                if self._plane.store.leads():  # once for every plane on the store
                    self.sweeps += 1
                    expire_due(self._plane)
            except Exception:
                # A failed sweep is retried at the next tick; expiry itself is
                # enforced at every use, so nothing waits on it.
                log.exception("approval sweep failed")
