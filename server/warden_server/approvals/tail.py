"""Approval changes of every process, read from the audit log.

When several processes serve one store (``[server] processes``), a watcher is
connected to one of them while the change it waits for may be committed by
another. Every transition is an audit record (SPEC §7), so each process tails
the log for approval records and fans them out to its own watchers: the audit
log is the one event bus, and a watcher hears of every change whichever
process made it, in the order the chain committed them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Final, get_args

from warden_server.approvals.events import ApprovalChange, ApprovalHub, Transition
from warden_server.store import Store

log = logging.getLogger(__name__)

TRANSITIONS: Final = frozenset(get_args(Transition))
STATE_AFTER: Final = {
    "requested": "pending",
    "approved": "approved",
    "denied": "denied",
    "expired": "expired",
    "consumed": "consumed",
}
"""The state an approval is in right after each transition."""
BATCH: Final = 500


class ApprovalTail:
    """A thread that delivers the approval records committed after it started."""

    def __init__(self, store: Store, hub: ApprovalHub, interval: float = 0.05) -> None:
        self._store = store
        self._hub = hub
        self._interval = interval
        self._seq = store.last_seq()
        """The last record read: every record up to it has been looked at."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warden-approval-tail", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    @property
    def read_through(self) -> int:
        """The sequence number of the last record read."""
        return self._seq

    def poll(self) -> int:
        """Deliver what was committed since the last poll; returns how many changes.

        The records read are those up to the newest at the start of the poll:
        sequence numbers are given in commit order, so every record up to it
        is committed, and the next poll starts after it whether or not any of
        them was an approval's (otherwise every poll of a plane without
        approvals would read the whole log written since it started).
        """
        delivered = 0
        newest = self._store.last_seq()
        while True:
            found = self._store.approval_transitions(self._seq, newest, BATCH)
            for seq, transition, approval_id in found:
                self._seq = seq
                record = self._store.get_approval(approval_id)
                if record is None or transition not in TRANSITIONS:
                    continue  # pruned since, or not a transition watchers hear of
                # The row may have moved on since; the watcher hears this step.
                record = dataclasses.replace(record, state=STATE_AFTER[transition])
                self._hub.deliver([ApprovalChange(transition, record, seq)])  # type: ignore[arg-type]
                delivered += 1
            if len(found) < BATCH:
                self._seq = max(self._seq, newest)
                return delivered

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll()
            except Exception:
                # The store may be briefly unavailable; the next poll resumes
                # from the last record delivered.
                log.exception("reading approval changes from the audit log failed")
