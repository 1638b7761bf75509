"""The fan-out from committed approval transitions to watchers."""

from __future__ import annotations

import threading

import pytest

from tests.unit.approval_records import pending
from warden_server.approvals.events import (
    ApprovalChange,
    ApprovalHub,
    WatcherFellBehind,
    WatchLimitReached,
)


def change(tenant: str, approval_id: str = "a1") -> ApprovalChange:
    return ApprovalChange("requested", pending(approval_id, tenant=tenant))


def test_a_subscriber_receives_only_its_tenants_changes_in_order() -> None:
    hub = ApprovalHub()
    acme = hub.subscribe("acme")
    hub.publish([change("acme", "a1"), change("globex", "g1"), change("acme", "a2")])
    acme.close()
    assert [c.approval.approval_id for c in acme] == ["a1", "a2"]


def test_closing_ends_a_blocked_iteration() -> None:
    hub = ApprovalHub()
    subscription = hub.subscribe("acme")
    received: list[ApprovalChange] = []
    reader = threading.Thread(target=lambda: received.extend(subscription))
    reader.start()
    hub.close()
    reader.join(timeout=10)
    assert not reader.is_alive() and received == []
    assert hub.watchers == 0
    assert list(hub.subscribe("acme")) == []  # a stopping plane accepts no new watcher


def test_a_watcher_that_falls_behind_is_cut_off_after_its_backlog() -> None:
    hub = ApprovalHub(backlog=2)
    subscription = hub.subscribe("acme")
    hub.publish([change("acme", f"a{i}") for i in range(3)])
    received = []
    with pytest.raises(WatcherFellBehind):
        received.extend(c.approval.approval_id for c in subscription)
    assert received == ["a0", "a1"]
    assert hub.watchers == 0


def test_the_number_of_watchers_is_limited_and_freed_on_close() -> None:
    hub = ApprovalHub(max_watchers=1)
    first = hub.subscribe("acme")
    with pytest.raises(WatchLimitReached):
        hub.subscribe("acme")
    first.close()
    hub.subscribe("globex").close()
