"""The approval lifecycle (SPEC §7) against the real plane: deciding, refusals,
expiry, watching, policy changes, and the CLI."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.approving import (
    approval_rows,
    approver,
    held_writer,
    install_clock,
)
from tests.integration.lab import LAB_POLICIES, Lab, build_lab, write_lab_policies
from warden.shared.canonical import digest
from warden_server.approvals.expiry import expire_due
from warden_server.cli import main
from warden_server.policy.loader import load_policies
from warden_server.store import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]


def suspend(rt: warden.Runtime, plant: Plant, n: int = 42, **actor: Any) -> warden.Envelope:
    env = rt.invoke("orders.echo", {"n": n, "note": "please"}, actor=plant.token(**actor))
    assert env.status == "suspended", env
    assert env.approval_id
    return env


def resume(rt: warden.Runtime, plant: Plant, approval_id: str, **actor: Any) -> warden.Envelope:
    return rt.invoke(
        "orders.echo",
        {"n": 42, "note": "please"},
        actor=plant.token(**actor),
        approval_id=approval_id,
    )


def refusal(plant: Plant, approval_id: str) -> dict[str, Any]:
    (row,) = [r for r in approval_rows(plant, approval_id) if r["status"] == "refused"]
    return row


# -- reading ---------------------------------------------------------------------


def test_an_approver_reads_what_they_would_approve(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = suspend(lab_rt, lab_plant)
    with approver(lab_plant) as approvals:
        (listed,) = approvals.list()
        shown = approvals.get(listed.id)
    assert listed == shown
    assert shown.id == env.approval_id
    assert (shown.capability_id, shown.capability_version) == ("orders.echo", "1")
    assert (shown.requester_id, shown.tenant, shown.service) == ("bot-7", "acme", "orders")
    assert shown.input == {"n": 42, "note": "please"}
    assert shown.input_digest == digest({"n": 42, "note": "please"})
    assert shown.rule_id == "lab-approval"
    assert shown.message == "Forty-two needs a second pair of eyes."
    assert shown.state == "pending" and shown.may_decide
    assert shown.invocation_id == env.invocation_id
    assert (shown.expires_at - shown.created_at).total_seconds() == 3600  # the server default
    (requested,) = approval_rows(lab_plant, shown.id)
    assert (requested["status"], requested["actor_id"]) == ("requested", "bot-7")
    assert requested["invocation_id"] == env.invocation_id


def test_a_rule_ttl_sets_the_expiry(start_plane: Callable[..., Plant], tmp_path: Path) -> None:
    folder = write_lab_policies(tmp_path / "ttl")
    (folder / "lab.yaml").write_text(
        LAB_POLICIES.replace(
            "approvers: '\"manager\" in approver.roles'", "approvers: 'true'\n    ttl: 90s"
        )
    )
    plant = start_plane(folder)
    rt = build_lab(plant.target, ORDERS_TOKEN, Lab())
    try:
        env = suspend(rt, plant)
    finally:
        rt.close()
    with approver(plant) as approvals:
        shown = approvals.get(env.approval_id or "")
    assert (shown.expires_at - shown.created_at).total_seconds() == 90


def test_listing_filters_by_state(lab_rt: warden.Runtime, lab_plant: Plant) -> None:
    first = suspend(lab_rt, lab_plant)
    second = suspend(lab_rt, lab_plant)
    with approver(lab_plant) as approvals:
        approvals.deny(first.approval_id or "", reason="no")
        assert [a.id for a in approvals.list()] == [second.approval_id]
        assert [a.id for a in approvals.list(states=["denied"])] == [first.approval_id]
        assert {a.id for a in approvals.list(states=[])} == {
            first.approval_id,
            second.approval_id,
        }


# -- deciding --------------------------------------------------------------------


def test_approve_then_resume_runs_the_handler_once_with_exactly_the_approved_input(
    lab_rt: warden.Runtime, lab_plant: Plant, lab: Lab
) -> None:
    env = suspend(lab_rt, lab_plant)
    with approver(lab_plant) as approvals:
        approved = approvals.approve(env.approval_id or "", reason="looks right")
    assert (approved.state, approved.decided_by, approved.reason) == (
        "approved",
        "mia",
        "looks right",
    )
    resumed = resume(lab_rt, lab_plant, approved.id)
    assert resumed.status == "succeeded"
    assert lab.count("echo") == 1 and lab.inputs[0].model_dump() == {"n": 42, "note": "please"}
    (stored,) = lab_plant.rows("SELECT state FROM approvals")
    assert stored["state"] == "consumed"
    rows = approval_rows(lab_plant, approved.id)
    assert [(r["status"], r["actor_id"]) for r in rows] == [
        ("requested", "bot-7"),
        ("approved", "mia"),
        ("consumed", "bot-7"),
    ]
    assert json.loads(rows[1]["details"]) == {"reason": "looks right"}
    assert rows[2]["invocation_id"] == resumed.invocation_id
    # Deciding it now is refused in words that say who did what.
    with approver(lab_plant) as approvals, pytest.raises(warden.ApprovalError) as raised:
        approvals.approve(approved.id)
    assert raised.value.status == "FAILED_PRECONDITION"
    assert str(raised.value).endswith(
        f"approval {approved.id} is already consumed"
        " (approved by mia, then used by the resumed call)"
    )


def test_a_denial_needs_a_reason_and_the_resumed_call_carries_it(
    lab_rt: warden.Runtime, lab_plant: Plant, lab: Lab
) -> None:
    env = suspend(lab_rt, lab_plant)
    with approver(lab_plant) as approvals:
        with pytest.raises(warden.ApprovalError) as raised:
            approvals.deny(env.approval_id or "", reason="  ")
        assert raised.value.status == "INVALID_ARGUMENT"
        denied = approvals.deny(env.approval_id or "", reason="Refund the customer instead.")
    assert denied.state == "denied"
    resumed = resume(lab_rt, lab_plant, denied.id)
    assert resumed.status == "failed" and resumed.error is not None
    assert resumed.error.code == "APPROVAL_DENIED" and resumed.error.stage == "approval"
    assert resumed.error.details == {"reason": "Refund the customer instead."}
    assert lab.count("echo") == 0
    statuses = [(r["status"], r["reason"]) for r in approval_rows(lab_plant, denied.id)]
    assert statuses == [
        ("requested", None),
        ("refused", "no-reason"),
        ("denied", None),
        ("refused", "approval-denied"),
    ]


def test_a_pending_approval_keeps_the_resumed_call_suspended(
    lab_rt: warden.Runtime, lab_plant: Plant, lab: Lab
) -> None:
    env = suspend(lab_rt, lab_plant)
    again = resume(lab_rt, lab_plant, env.approval_id or "")
    assert again.status == "suspended" and again.approval_id == env.approval_id
    assert lab.count("echo") == 0
    assert [r["status"] for r in approval_rows(lab_plant, again.approval_id or "")] == ["requested"]


def test_si6_the_requester_cannot_approve_their_own_request(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    # A manager's own call: the approvers condition alone would let them approve it.
    env = suspend(lab_rt, lab_plant, sub="mia", roles=("manager",))
    with approver(lab_plant, "mia") as approvals:
        assert approvals.get(env.approval_id or "").may_decide is False
        for decide in (approvals.approve, lambda i: approvals.deny(i, reason="mine")):
            with pytest.raises(warden.ApprovalError) as raised:
                decide(env.approval_id or "")
            assert raised.value.status == "PERMISSION_DENIED"
            assert "separation of duties" in str(raised.value)
    rows = approval_rows(lab_plant, env.approval_id or "")
    assert [(r["status"], r["reason"], r["actor_id"]) for r in rows[1:]] == [
        ("refused", "separation-of-duties", "mia"),
        ("refused", "separation-of-duties", "mia"),
    ]
    assert rows[1]["stage"] == "approval"
    with approver(lab_plant, "max") as approvals:
        assert approvals.approve(env.approval_id or "").decided_by == "max"


def test_si6_an_approver_outside_the_approvers_condition_cannot_approve(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = suspend(lab_rt, lab_plant)
    with approver(lab_plant, "sam", roles=("support",)) as approvals:
        assert approvals.get(env.approval_id or "").may_decide is False
        with pytest.raises(warden.ApprovalError) as raised:
            approvals.approve(env.approval_id or "")
    assert raised.value.status == "PERMISSION_DENIED"
    assert "lab-approval" in str(raised.value)
    row = refusal(lab_plant, env.approval_id or "")
    assert (row["reason"], row["actor_id"]) == ("not-an-approver:lab-approval", "sam")
    assert lab_plant.rows("SELECT state FROM approvals")[0]["state"] == "pending"


def test_si6_another_tenants_approver_sees_nothing_and_cannot_decide(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = suspend(lab_rt, lab_plant)
    approval_id = env.approval_id or ""
    with approver(lab_plant, "otto", tenant="globex") as approvals:
        assert approvals.list(states=[]) == []
        faces = []
        for attempt in (approvals.get, approvals.approve):
            for target in (approval_id, "f" * 32):
                with pytest.raises(warden.ApprovalError) as raised:
                    attempt(target)
                faces.append((raised.value.status, str(raised.value).replace(target, "ID")))
    assert set(faces) == {("NOT_FOUND", "approval 'ID' not found")}
    row = refusal(lab_plant, approval_id)
    # The truth is recorded against the tenant whose approval it is.
    assert (row["reason"], row["actor_id"], row["tenant"]) == ("other-tenant", "otto", "acme")
    assert lab_plant.rows("SELECT state FROM approvals")[0]["state"] == "pending"


def test_decisions_are_idempotent_for_the_decider_and_final_for_everyone_else(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = suspend(lab_rt, lab_plant)
    approval_id = env.approval_id or ""
    with approver(lab_plant, "mia") as mia, approver(lab_plant, "max") as max_:
        first = mia.approve(approval_id)
        assert mia.approve(approval_id) == first
        for attempt in (
            lambda: mia.deny(approval_id, reason="changed my mind"),
            lambda: max_.approve(approval_id),
            lambda: max_.deny(approval_id, reason="no"),
        ):
            with pytest.raises(warden.ApprovalError) as raised:
                attempt()
            assert raised.value.status == "FAILED_PRECONDITION"
            assert "already approved by mia" in str(raised.value)
    statuses = [r["status"] for r in approval_rows(lab_plant, approval_id)]
    assert statuses == ["requested", "approved", "refused", "refused", "refused"]


def test_an_unauthenticated_decision_is_refused_and_recorded(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = suspend(lab_rt, lab_plant)
    with (
        warden.Approvals(lab_plant.target, token="not-a-jwt") as approvals,
        pytest.raises(warden.ApprovalError) as raised,
    ):
        approvals.approve(env.approval_id or "")
    assert raised.value.status == "UNAUTHENTICATED"
    row = refusal(lab_plant, env.approval_id or "")
    assert row["actor_id"] is None and row["reason"].startswith("unauthenticated: ")


@pytest.mark.single_process
def test_si6_two_concurrent_resumes_of_one_approval_exactly_one_wins(
    lab_rt: warden.Runtime, lab_plant: Plant, lab: Lab
) -> None:
    env = suspend(lab_rt, lab_plant)
    with approver(lab_plant) as approvals:
        approvals.approve(env.approval_id or "")
    store = lab_plant.server.plane.store
    assert isinstance(store, SQLiteStore)
    results: list[warden.Envelope] = []

    def race() -> None:
        results.append(resume(lab_rt, lab_plant, env.approval_id or ""))

    # Both resumes pass every check while the writer is held, so both try to
    # consume the approval in the same committed batch: the store decides.
    with held_writer(store):
        racers = [threading.Thread(target=race) for _ in range(2)]
        for racer in racers:
            racer.start()
        deadline = time.monotonic() + 10
        while store._queue.qsize() < 2 and time.monotonic() < deadline:  # both grants queued
            time.sleep(0.005)
        assert store._queue.qsize() == 2
    for racer in racers:
        racer.join()
    assert sorted(r.status for r in results) == ["failed", "succeeded"]
    (loser,) = [r for r in results if r.status == "failed"]
    assert loser.error is not None and loser.error.code == "APPROVAL_DENIED"
    assert lab.count("echo") == 1
    statuses = [r["status"] for r in approval_rows(lab_plant, env.approval_id or "")]
    assert statuses.count("consumed") == 1 and statuses.count("refused") == 1


def test_si6_an_approval_for_730_cannot_resume_a_refund_of_7300(
    plant: Plant, orders: warden.Runtime
) -> None:
    support = plant.token(sub="bot-7", roles=("support",))
    asked = orders.invoke("orders.refund", {"order_id": "A1", "amount": 730}, actor=support)
    assert asked.status == "suspended"
    with approver(plant, "mia") as approvals:
        assert approvals.get(asked.approval_id or "").input == {"order_id": "A1", "amount": 730}
        approvals.approve(asked.approval_id or "")
    edited = orders.invoke(
        "orders.refund",
        {"order_id": "A1", "amount": 7300},
        actor=support,
        approval_id=asked.approval_id,
    )
    assert edited.status == "failed" and edited.error is not None
    assert edited.error.code == "APPROVAL_DENIED"
    assert plant.events(invocation_id=edited.invocation_id, kind="outcome") == []
    row = refusal(plant, asked.approval_id or "")
    assert row["reason"] == "approval-not-bound:input_digest"
    exact = orders.invoke(
        "orders.refund",
        {"order_id": "A1", "amount": 730},
        actor=support,
        approval_id=asked.approval_id,
    )
    assert exact.status == "succeeded" and exact.output.amount == 730


# -- expiry ------------------------------------------------------------------------


@pytest.mark.single_process
def test_si6_an_expired_pending_approval_cannot_be_approved(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    clock = install_clock(lab_plant)
    env = suspend(lab_rt, lab_plant)
    clock.advance(minutes=59)
    with approver(lab_plant) as approvals:
        assert approvals.get(env.approval_id or "").may_decide
        clock.advance(minutes=1)
        assert approvals.get(env.approval_id or "").state == "expired"
        with pytest.raises(warden.ApprovalError) as raised:
            approvals.approve(env.approval_id or "")
    assert raised.value.status == "FAILED_PRECONDITION" and "expired" in str(raised.value)
    rows = approval_rows(lab_plant, env.approval_id or "")
    assert [(r["status"], r["reason"]) for r in rows] == [
        ("requested", None),
        ("expired", None),
        ("refused", "approval-expired"),
    ]
    assert lab_plant.rows("SELECT state FROM approvals")[0]["state"] == "expired"


@pytest.mark.single_process
def test_si6_an_approval_that_expires_before_use_gives_approval_expired(
    lab_rt: warden.Runtime, lab_plant: Plant, lab: Lab
) -> None:
    clock = install_clock(lab_plant)
    env = suspend(lab_rt, lab_plant)
    with approver(lab_plant) as approvals:
        approvals.approve(env.approval_id or "")
    clock.advance(hours=1)
    resumed = resume(lab_rt, lab_plant, env.approval_id or "")
    assert resumed.status == "failed" and resumed.error is not None
    assert resumed.error.code == "APPROVAL_EXPIRED" and resumed.error.retryable
    assert lab.count("echo") == 0
    statuses = [r["status"] for r in approval_rows(lab_plant, env.approval_id or "")]
    assert statuses == ["requested", "approved", "expired", "refused"]
    again = resume(lab_rt, lab_plant, env.approval_id or "")
    assert again.error is not None and again.error.code == "APPROVAL_EXPIRED"
    # A fresh call asks afresh.
    assert suspend(lab_rt, lab_plant).approval_id != env.approval_id


@pytest.mark.single_process
def test_the_sweep_expires_due_approvals_and_tells_watchers(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    clock = install_clock(lab_plant)
    due = suspend(lab_rt, lab_plant)
    clock.advance(minutes=30)
    later = suspend(lab_rt, lab_plant)
    with approver(lab_plant) as approvals:
        events = watch_in_background(approvals)
        assert {events.get(timeout=10).approval.id for _ in range(2)} == {
            due.approval_id,
            later.approval_id,
        }
        clock.advance(minutes=30)
        expired = expire_due(lab_plant.server.plane)
        event = events.get(timeout=10)
    assert [c.approval.approval_id for c in expired] == [due.approval_id]
    assert (event.type, event.approval.id, event.approval.state) == (
        "expired",
        due.approval_id,
        "expired",
    )
    assert expire_due(lab_plant.server.plane) == []
    (row,) = [
        r for r in approval_rows(lab_plant, due.approval_id or "") if r["status"] == "expired"
    ]
    assert row["actor_id"] is None and json.loads(row["details"]) == {"from": "pending"}


@pytest.mark.single_process
def test_the_running_plane_sweeps_on_its_own(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    plant = start_plane(write_lab_policies(tmp_path / "lab"), approval_sweep_seconds=0.05)
    clock = install_clock(plant)
    rt = build_lab(plant.target, ORDERS_TOKEN, Lab())
    try:
        env = suspend(rt, plant)
    finally:
        rt.close()
    with approver(plant) as approvals:
        events = watch_in_background(approvals)
        assert events.get(timeout=10).type == "pending"
        clock.advance(hours=1)
        event = events.get(timeout=10)
    assert (event.type, event.approval.id) == ("expired", env.approval_id)


# -- watching ----------------------------------------------------------------------


def watch_in_background(
    approvals: warden.Approvals, include_pending: bool = True
) -> queue.Queue[warden.ApprovalEvent]:
    """Events of a watch stream as they arrive; the test blocks on ``get``, never polls."""
    events: queue.Queue[warden.ApprovalEvent] = queue.Queue()

    def pump() -> None:
        try:
            for event in approvals.watch(include_pending=include_pending):
                events.put(event)
        except warden.ApprovalError:
            pass  # the plane stopped at teardown

    threading.Thread(target=pump, daemon=True).start()
    return events


def test_a_watcher_receives_each_transition_as_it_happens(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    waiting = suspend(lab_rt, lab_plant)
    with approver(lab_plant) as approvals, approver(lab_plant, "otto", tenant="globex") as other:
        events = watch_in_background(approvals)
        # The stream first names what was waiting: from then on it is subscribed.
        first = events.get(timeout=10)
        assert (first.type, first.approval.id) == ("pending", waiting.approval_id)
        foreign = watch_in_background(other)

        env = suspend(lab_rt, lab_plant)
        requested = events.get(timeout=10)
        assert (requested.type, requested.approval.id) == ("requested", env.approval_id)
        assert requested.approval.may_decide

        approvals.approve(env.approval_id or "")
        approved = events.get(timeout=10)
        assert (approved.type, approved.approval.decided_by) == ("approved", "mia")

        assert resume(lab_rt, lab_plant, env.approval_id or "").status == "succeeded"
        consumed = events.get(timeout=10)
        assert (consumed.type, consumed.approval.state) == ("consumed", "consumed")

        # The other tenant's watcher heard none of it: its first event is its own.
        own = suspend(lab_rt, lab_plant, sub="gus", tenant="globex")
        heard = foreign.get(timeout=10)
        assert (heard.type, heard.approval.id, heard.approval.tenant) == (
            "requested",
            own.approval_id,
            "globex",
        )


def test_watchers_are_limited(start_plane: Callable[..., Plant], tmp_path: Path) -> None:
    plant = start_plane(write_lab_policies(tmp_path / "lab"), max_approval_watchers=1)
    with approver(plant) as first, approver(plant, "max") as second:
        events = watch_in_background(first)
        rt = build_lab(plant.target, ORDERS_TOKEN, Lab())
        try:
            suspend(rt, plant)
        finally:
            rt.close()
        assert events.get(timeout=10).type in ("pending", "requested")
        with pytest.raises(warden.ApprovalError) as raised:
            next(iter(second.watch()))
    assert raised.value.status == "RESOURCE_EXHAUSTED"
    assert "max_approval_watchers" in str(raised.value)


# -- policy changes --------------------------------------------------------------------


def swap_policies(plant: Plant, folder: Path, text: str) -> None:
    folder.mkdir()
    (folder / "lab.yaml").write_text(text)
    plant.server.plane.policies.swap(load_policies(folder))


@pytest.mark.single_process
def test_a_narrowed_approvers_condition_applies_to_waiting_approvals(
    lab_rt: warden.Runtime, lab_plant: Plant, tmp_path: Path
) -> None:
    env = suspend(lab_rt, lab_plant)
    narrowed = LAB_POLICIES.replace('"manager" in approver.roles', '"director" in approver.roles')
    swap_policies(lab_plant, tmp_path / "narrowed", narrowed)
    with (
        approver(lab_plant, "mia") as manager,
        approver(lab_plant, "dora", roles=("director",)) as director,
    ):
        assert manager.get(env.approval_id or "").may_decide is False
        with pytest.raises(warden.ApprovalError) as raised:
            manager.approve(env.approval_id or "")
        assert raised.value.status == "PERMISSION_DENIED"
        assert director.approve(env.approval_id or "").state == "approved"


@pytest.mark.single_process
def test_a_withdrawn_rule_leaves_its_approvals_undecidable(
    lab_rt: warden.Runtime, lab_plant: Plant, tmp_path: Path, lab: Lab
) -> None:
    env = suspend(lab_rt, lab_plant)
    start = LAB_POLICIES.index("  - id: lab-approval")
    end = LAB_POLICIES.index("  - id: lab-hide")
    swap_policies(lab_plant, tmp_path / "withdrawn", LAB_POLICIES[:start] + LAB_POLICIES[end:])
    with approver(lab_plant) as approvals, pytest.raises(warden.ApprovalError) as raised:
        approvals.approve(env.approval_id or "")
    assert raised.value.status == "FAILED_PRECONDITION"
    assert "no longer asks for approval" in str(raised.value)
    assert refusal(lab_plant, env.approval_id or "")["reason"] == "rule-withdrawn:lab-approval"
    # The resumed call is decided afresh: the policies now allow it outright,
    # and the approval it presented goes with it.
    first = resume(lab_rt, lab_plant, env.approval_id or "")
    assert first.status == "succeeded" and lab.count("echo") == 1
    consumed = [
        r for r in approval_rows(lab_plant, env.approval_id or "") if r["status"] == "consumed"
    ]
    assert [r["invocation_id"] for r in consumed] == [first.invocation_id]
    # The rule comes back: the approval can neither be decided nor run the call again.
    swap_policies(lab_plant, tmp_path / "restored", LAB_POLICIES)
    with approver(lab_plant) as approvals:
        assert approvals.get(env.approval_id or "").state == "consumed"
        with pytest.raises(warden.ApprovalError):
            approvals.approve(env.approval_id or "")
    again = resume(lab_rt, lab_plant, env.approval_id or "")
    assert again.error is not None and again.error.code == "APPROVAL_DENIED"
    assert lab.count("echo") == 1


@pytest.mark.single_process
def test_an_approval_from_a_rule_no_longer_deciding_asks_afresh(
    lab_rt: warden.Runtime, lab_plant: Plant, tmp_path: Path, lab: Lab
) -> None:
    env = suspend(lab_rt, lab_plant)
    with approver(lab_plant) as approvals:
        approvals.approve(env.approval_id or "")
    swap_policies(
        lab_plant,
        tmp_path / "renamed",
        LAB_POLICIES.replace("id: lab-approval", "id: lab-approval-by-directors"),
    )
    resumed = resume(lab_rt, lab_plant, env.approval_id or "")
    assert resumed.status == "suspended" and resumed.approval_id != env.approval_id
    assert lab.count("echo") == 0
    assert refusal(lab_plant, env.approval_id or "")["reason"] == "approval-rule-changed"
    with approver(lab_plant) as approvals:
        assert approvals.get(env.approval_id or "").state == "approved"  # not consumed
        assert approvals.get(resumed.approval_id or "").rule_id == "lab-approval-by-directors"


def test_the_approvers_condition_reads_approver_requester_capability_and_input(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    condition = (
        'approver.attrs.team == requester.attrs.team && requester.id != "" && '
        'capability.id == "orders.echo" && capability.side_effect == "read" && input.n == 42'
    )
    folder = tmp_path / "teams"
    folder.mkdir()
    (folder / "lab.yaml").write_text(
        LAB_POLICIES.replace("'\"manager\" in approver.roles'", f"'{condition}'")
    )
    plant = start_plane(folder)
    rt = build_lab(plant.target, ORDERS_TOKEN, Lab())
    try:
        env = suspend(rt, plant, team="payments")
    finally:
        rt.close()
    with approver(plant, "pat", team="search") as outsider:
        assert outsider.get(env.approval_id or "").may_decide is False
    with approver(plant, "pia", team="payments") as teammate:
        assert teammate.approve(env.approval_id or "").state == "approved"


@pytest.mark.parametrize(
    "level",
    ["high", 1, ["manager"], {"manager": True}, None],
    ids=["string", "number", "list", "map", "null"],
)
def test_si6_an_approvers_condition_that_is_not_true_approves_nobody(
    start_plane: Callable[..., Plant], tmp_path: Path, level: Any
) -> None:
    """Only ``true`` approves: a truthy string, number, list or map, or a null,
    is not an approval."""
    folder = tmp_path / "levels"
    folder.mkdir()
    (folder / "lab.yaml").write_text(
        LAB_POLICIES.replace("'\"manager\" in approver.roles'", "approver.attrs.level")
    )
    plant = start_plane(folder)
    rt = build_lab(plant.target, ORDERS_TOKEN, Lab())
    try:
        env = suspend(rt, plant)
    finally:
        rt.close()
    approval_id = env.approval_id or ""
    with approver(plant, "lee", level=level) as approvals:
        assert approvals.get(approval_id).may_decide is False
        with pytest.raises(warden.ApprovalError) as raised:
            approvals.approve(approval_id)
    assert raised.value.status == "PERMISSION_DENIED"
    assert refusal(plant, approval_id)["reason"] == "not-an-approver:lab-approval"
    with approver(plant, "lou", level=True) as approvals:
        assert approvals.approve(approval_id).state == "approved"


# -- the CLI --------------------------------------------------------------------------


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, ["approvals", *args], catch_exceptions=False)


def test_cli_lists_shows_approves_and_denies(lab_rt: warden.Runtime, lab_plant: Plant) -> None:
    first = suspend(lab_rt, lab_plant)
    second = suspend(lab_rt, lab_plant)
    access = (
        "--target",
        lab_plant.target,
        "--token",
        lab_plant.token(sub="mia", roles=("manager",)),
    )

    listed = cli("list", *access)
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert lines[0].split()[:3] == ["ID", "STATE", "CAPABILITY"]
    assert {line.split()[0] for line in lines[1:]} == {first.approval_id, second.approval_id}

    shown = cli("show", first.approval_id or "", *access)
    assert shown.exit_code == 0
    assert "requester:      bot-7" in shown.output and '"note": "please"' in shown.output

    approved = cli("approve", first.approval_id or "", *access)
    assert approved.output.strip() == f"{first.approval_id} approved by mia"
    denied = cli("deny", second.approval_id or "", "--reason", "Not today.", *access)
    assert denied.output.strip() == f"{second.approval_id} denied by mia"

    as_json = cli("list", "--all", "--json", *access)
    states = {
        json.loads(line)["id"]: json.loads(line)["state"] for line in as_json.output.splitlines()
    }
    assert states == {first.approval_id: "approved", second.approval_id: "denied"}

    refused = cli("approve", second.approval_id or "", *access)
    assert refused.exit_code == 1
    assert "FAILED_PRECONDITION: approval" in refused.output and "already denied" in refused.output
    missing = cli("deny", first.approval_id or "", *access)
    assert missing.exit_code == 2 and "--reason" in missing.output


def test_cli_mistakes_are_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """No token says both places a token may come from; a --limit the plane
    would refuse (or, below one, crash the request) is refused with its range."""
    monkeypatch.delenv("WARDEN_TOKEN", raising=False)
    no_token = cli("list")
    assert no_token.exit_code == 2
    assert "no token: give a JWT with --token, or set WARDEN_TOKEN" in no_token.output
    for limit in ("-1", "0", "1001"):
        bad = cli("list", "--token", "t", "--limit", limit)
        assert bad.exit_code == 2 and "is not in the range 1<=x<=1000" in bad.output


def test_cli_list_watch_prints_events_as_they_happen(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    token = lab_plant.token(sub="mia", roles=("manager",))
    waiting = suspend(lab_rt, lab_plant)
    command = [sys.executable, "-m", "warden_server.cli", "approvals", "list", "--watch"]
    watcher = subprocess.Popen(
        [*command, "--target", lab_plant.target],
        env={"WARDEN_TOKEN": token, "PATH": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        lines: Iterator[str] = iter(watcher.stdout.readline, "")
        assert next(lines).split()[:2] == ["EVENT", "ID"]
        assert next(lines).split()[:2] == ["pending", waiting.approval_id]
        env = suspend(lab_rt, lab_plant)
        assert next(lines).split()[:3] == ["requested", env.approval_id, "pending"]
    finally:
        watcher.terminate()
        watcher.wait(timeout=10)


def test_cli_list_says_why_it_lists_nothing(lab_rt: warden.Runtime, lab_plant: Plant) -> None:
    """Approvals are kept per tenant: a manager whose token names no tenant
    sees none of acme's, and is told why instead of seeing an empty table."""
    suspend(lab_rt, lab_plant)  # acme's
    no_tenant = lab_plant.token(sub="mia", roles=("manager",), tenant="")
    listed = cli("list", "--target", lab_plant.target, "--token", no_tenant)
    assert listed.exit_code == 0
    assert listed.stdout.split()[:2] == ["ID", "STATE"] and len(listed.stdout.splitlines()) == 1
    assert "no pending approvals: your token names no tenant" in listed.stderr
    globex = lab_plant.token(sub="gil", roles=("manager",), tenant="globex")
    listed = cli("list", "--all", "--json", "--target", lab_plant.target, "--token", globex)
    assert listed.stdout == ""
    assert listed.stderr.strip() == "no approvals in tenant globex"
    acme = lab_plant.token(sub="mia", roles=("manager",))
    assert cli("list", "--target", lab_plant.target, "--token", acme).stderr == ""


@pytest.mark.fixed_processes
def test_every_approvals_command_is_documented() -> None:
    guide = (ROOT / "docs" / "approvals.md").read_text()
    group = main.get_command(click.Context(main), "approvals")
    assert isinstance(group, click.Group)
    for name, command in group.commands.items():
        assert f"warden approvals {name}" in guide, name
        assert command.help
