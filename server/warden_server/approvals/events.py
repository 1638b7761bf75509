"""Approval events for watchers: every committed transition, fanned out to the
open watch streams of its tenant as it happens.

The fan-out is in memory. A plane of one process publishes what it commits
at once; where several processes share the store, each hears every process's
changes from the audit log instead (``approvals/tail.py``).

Each subscriber has a bounded backlog; one that falls further behind is cut
off (``WatcherFellBehind``) rather than allowed to hold the plane's memory,
and re-lists before watching again.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from warden_server.errors import ResourceExhausted
from warden_server.store import ApprovalRecord

Transition = Literal["requested", "approved", "denied", "expired", "consumed"]


@dataclass(frozen=True, slots=True)
class ApprovalChange:
    """One committed transition of one approval, with the approval after it."""

    kind: Transition
    approval: ApprovalRecord
    seq: int | None = None
    """The audit record of the transition, when it was read from the log."""


class WatchLimitReached(ResourceExhausted):
    """This process of the plane already serves its maximum of watch streams."""


class WatcherFellBehind(ResourceExhausted):
    """A watcher did not keep up; the events it missed are lost to it."""


class Subscription:
    """One watcher's backlog of changes; iterate to receive them as they come.

    Iteration blocks until a change arrives and ends when the subscription is
    closed (by the watcher leaving or the plane stopping).
    """

    def __init__(self, hub: ApprovalHub, tenant: str, backlog: int, since: int = 0) -> None:
        self.tenant = tenant
        self.since = since
        """Changes the log recorded at or before this sequence number happened
        before the subscription (what the watcher lists first shows them)."""
        self._hub = hub
        self._backlog = backlog
        self._changes: deque[ApprovalChange] = deque()
        self._ready = threading.Condition()
        self._closed = False
        self._fell_behind = False

    def offer(self, change: ApprovalChange) -> None:
        with self._ready:
            if self._closed:
                return
            if len(self._changes) >= self._backlog:
                self._fell_behind = self._closed = True
            else:
                self._changes.append(change)
            self._ready.notify()
        if self._fell_behind:
            self._hub.forget(self)

    def close(self) -> None:
        """Stop receiving; a blocked iteration ends. Safe to call more than once."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._hub.forget(self)

    def __iter__(self) -> Iterator[ApprovalChange]:
        while True:
            with self._ready:
                while not self._changes and not self._closed:
                    self._ready.wait()
                if self._changes:
                    change = self._changes.popleft()
                elif self._fell_behind:
                    raise WatcherFellBehind(
                        f"the watcher fell more than {self._backlog} events behind; "
                        "list the approvals again, then watch again"
                    )
                else:
                    return
            yield change

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ApprovalHub:
    """Fans committed approval transitions out to the subscribers of their tenant.

    Args:
        max_watchers: Subscriptions open at once at most.
        backlog: Undelivered changes a subscriber may have before it is cut off.
        shared: Several processes share the store; changes arrive by ``deliver``.
        last_seq: The newest audit sequence number (for ``shared``): where a
            new subscription starts.
    """

    def __init__(
        self,
        max_watchers: int = 4,
        backlog: int = 1000,
        *,
        shared: bool = False,
        last_seq: Callable[[], int] | None = None,
    ) -> None:
        self._shared = shared
        self._last_seq = last_seq
        """Other processes commit changes too: they are delivered from the audit
        log, and this process's own are not published twice."""
        self._max_watchers = max_watchers
        self._backlog = backlog
        self._subscriptions: set[Subscription] = set()
        self._lock = threading.Lock()
        self._closed = False

    def subscribe(self, tenant: str) -> Subscription:
        """A subscription to the tenant's changes from now on.

        Raises:
            WatchLimitReached: ``max_watchers`` subscriptions are open.
        """
        since = self._last_seq() if self._shared and self._last_seq is not None else 0
        subscription = Subscription(self, tenant, self._backlog, since)
        with self._lock:
            stopping = self._closed
            if not stopping:
                if len(self._subscriptions) >= self._max_watchers:
                    raise WatchLimitReached(
                        f"this process of the plane already serves its maximum of "
                        f"{self._max_watchers} approval watchers ([server] "
                        "max_approval_watchers, counted per process)"
                    )
                self._subscriptions.add(subscription)
        if stopping:
            subscription.close()
        return subscription

    def publish(self, changes: Iterable[ApprovalChange]) -> None:
        """Deliver changes this process committed to the store (never before)."""
        if not self._shared:
            self.deliver(changes)

    def deliver(self, changes: Iterable[ApprovalChange]) -> None:
        """Fan committed changes out to their tenants' watchers."""
        for change in changes:
            with self._lock:
                receivers = [
                    s
                    for s in self._subscriptions
                    if s.tenant == change.approval.tenant
                    and (change.seq is None or change.seq > s.since)
                ]
            for subscription in receivers:
                subscription.offer(change)

    def forget(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscriptions.discard(subscription)

    @property
    def watchers(self) -> int:
        with self._lock:
            return len(self._subscriptions)

    def close(self) -> None:
        """End every subscription (the plane is stopping); later ones end at once."""
        with self._lock:
            self._closed = True
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            subscription.close()
