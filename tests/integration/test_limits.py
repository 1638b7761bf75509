"""Policy limits end to end: rate limits, spend budgets and concurrency caps,
through the real SDK, the plane's processes and the audit log."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import grpc
import pytest
from click.testing import CliRunner, Result
from pydantic import BaseModel

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from warden.v1 import governor_pb2, governor_pb2_grpc
from warden_server.audit.reader import verify
from warden_server.cli import main

POLICIES = """
rules:
  - id: allow-all
    capabilities: ["orders.*"]
    effect: allow
  - id: big-refunds-need-a-manager
    capabilities: ["orders.refund"]
    effect: require_approval
    when: input.amount > 4000
    message: Refunds above 4000 need a manager.
    approvers: '"manager" in approver.roles'
limits:
  - id: pings-per-tenant
    capabilities: ["orders.ping"]
    key: actor.tenant
    rate: 1/hour
    burst: 20
    message: Too many pings; wait and try again.
  - id: refund-budget-per-tenant
    capabilities: ["orders.refund"]
    key: actor.tenant
    budget: 5000/day
    cost: input.amount
    message: Today's refund budget is spent; ask a manager to raise it.
  - id: exports-in-flight
    capabilities: ["orders.export"]
    key: actor.tenant
    concurrency: 2
    message: Two exports are running already; wait for one to finish.
  - id: one-card-at-a-time
    capabilities: ["orders.charge"]
    key: input.card
    concurrency: 1
  - id: charges-per-card
    capabilities: ["orders.charge"]
    key: '"card-" + input.card'
    rate: 100/hour
  - id: pings-rollout
    capabilities: ["orders.ping"]
    key: actor.id
    rate: 1/hour
    burst: 1
    mode: audit
"""


class Ping(BaseModel):
    n: int = 0


class Refund(BaseModel):
    amount: int
    note: str = ""


class Charge(BaseModel):
    card: Annotated[str, warden.Sensitive]


class Done(BaseModel):
    ok: bool = True


class Service:
    """A service with one capability per kind of limit; exports wait for a gate."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.running = threading.Semaphore(0)
        self.refunds = 0
        self.lock = threading.Lock()

    def runtime(self, target: str) -> warden.Runtime:
        rt = warden.Runtime(target, service="orders", token=ORDERS_TOKEN, retry=warden.NO_RETRY)

        @rt.capability("orders.ping", input=Ping, output=Done, side_effect="write")
        def ping(inp: Ping, ctx: warden.Context) -> Done:
            return Done()

        def not_blocked(inp: Refund, ctx: warden.Context) -> bool:
            return inp.note != "blocked"

        @rt.capability(
            "orders.refund",
            input=Refund,
            output=Done,
            side_effect="write",
            authorize=not_blocked,
        )
        def refund(inp: Refund, ctx: warden.Context) -> Done:
            with self.lock:
                self.refunds += 1
            return Done()

        @rt.capability("orders.charge", input=Charge, output=Done, side_effect="write")
        def charge(inp: Charge, ctx: warden.Context) -> Done:
            return Done()

        @rt.capability("orders.export", input=Ping, output=Done, side_effect="write")
        def export(inp: Ping, ctx: warden.Context) -> Done:
            self.running.release()
            assert self.gate.wait(30)
            return Done()

        return rt


@pytest.fixture
def limited(start_plane: Callable[..., Plant], tmp_path: Path) -> Plant:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "limits.yaml").write_text(POLICIES)
    return start_plane(folder, watch_policies=False)


@pytest.fixture
def service(limited: Plant) -> Iterator[Service]:
    found = Service()
    rt = found.runtime(limited.target)
    rt.register()
    rt.close()
    yield found
    found.gate.set()


def decision(plant: Plant, invocation_id: str) -> dict[str, Any]:
    (row,) = plant.events(invocation_id=invocation_id, kind="decision")
    return row


@pytest.mark.fixed_processes
def test_fifty_concurrent_calls_from_several_processes_admit_exactly_the_burst(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "limits.yaml").write_text(POLICIES)
    plant = start_plane(folder, watch_policies=False, processes=3)
    service = Service()
    runtimes = [service.runtime(plant.target) for _ in range(5)]
    runtimes[0].register()
    token = plant.token("bot-7", tenant="acme")

    def call(i: int) -> warden.Envelope:
        return runtimes[i % 5].invoke("orders.ping", {"n": i}, actor=token)

    try:
        with ThreadPoolExecutor(max_workers=25) as pool:
            envelopes = list(pool.map(call, range(50)))
    finally:
        for rt in runtimes:
            rt.close()
    granted = [e for e in envelopes if e.status == "succeeded"]
    refused = [e for e in envelopes if e.status == "failed"]
    assert len(granted) == 20
    assert len(refused) == 30
    for envelope in refused:
        assert envelope.error is not None
        assert envelope.error.code == "RATE_LIMITED"
        assert envelope.error.stage == "policy"
        assert envelope.error.retryable is True
        assert envelope.error.public_message == "Too many pings; wait and try again."
        assert envelope.error.details is not None
        assert envelope.error.details["retry_after_ms"] > 0
    limited_rows = plant.events(kind="decision", code="RATE_LIMITED")
    assert len(limited_rows) == 30
    for row in limited_rows:
        assert row["reason"] == "limited-by:pings-per-tenant"
        assert json.loads(row["rules"])["limits"]["limited"][0]["id"] == "pings-per-tenant"
    plant.await_outcome_reports()
    assert verify(plant.server.plane.store).ok


def test_a_budget_refuses_the_call_that_does_not_fit_and_gives_back_unrun_calls(
    limited: Plant, service: Service
) -> None:
    rt = service.runtime(limited.target)
    token = limited.token("bot-7", tenant="acme")
    try:
        blocked = rt.invoke("orders.refund", {"amount": 730, "note": "blocked"}, actor=token)
        assert blocked.status == "failed" and blocked.error is not None
        assert blocked.error.code == "FORBIDDEN"
        limited.await_outcome_reports()
        answers = [rt.invoke("orders.refund", {"amount": 730}, actor=token) for _ in range(7)]
    finally:
        rt.close()
    assert [a.status for a in answers] == ["succeeded"] * 6 + ["failed"]
    seventh = answers[6].error
    assert seventh is not None and seventh.code == "RATE_LIMITED"
    assert seventh.public_message == "Today's refund budget is spent; ask a manager to raise it."
    assert seventh.details is not None
    # The first refund leaves the day's window a day after it was granted.
    assert 0 < seventh.details["retry_after_ms"] <= timedelta(days=1).total_seconds() * 1000
    assert service.refunds == 6
    row = decision(limited, answers[6].invocation_id)
    assert row["reason"] == "limited-by:refund-budget-per-tenant"


def test_a_keyed_repeat_of_a_completed_call_is_replayed_when_the_budget_is_spent(
    limited: Plant, service: Service
) -> None:
    """A replay spends nothing, so no limit stops it: a caller that lost the
    answer to a refund gets that answer, not "the budget is spent"."""
    rt = service.runtime(limited.target)
    token = limited.token("bot-7", tenant="acme")
    try:
        first = rt.invoke("orders.refund", {"amount": 3000}, actor=token, idempotency_key="r-1")
        spent = rt.invoke("orders.refund", {"amount": 2000}, actor=token)
        over = rt.invoke("orders.refund", {"amount": 100}, actor=token)
        again = rt.invoke("orders.refund", {"amount": 3000}, actor=token, idempotency_key="r-1")
    finally:
        rt.close()
    assert [first.status, spent.status] == ["succeeded", "succeeded"]
    assert over.error is not None and over.error.code == "RATE_LIMITED"
    assert again.status == "succeeded" and again.replayed_from == first.invocation_id
    assert service.refunds == 2
    assert decision(limited, again.invocation_id)["reason"] == (
        f"idempotent-replay:{first.invocation_id}"
    )


def test_the_sdk_answers_at_once_when_the_budget_frees_only_tomorrow(
    limited: Plant, service: Service
) -> None:
    """A retry_after_ms of most of a day is not waited out, even for a call
    the runtime may retry (it carries a key): the failure is the answer."""
    rt = warden.Runtime(limited.target, service="orders", token=ORDERS_TOKEN)
    token = limited.token("bot-7", tenant="acme")
    try:
        spent = service.runtime(limited.target)
        try:
            for amount in (3000, 2000):
                assert spent.invoke("orders.refund", {"amount": amount}, actor=token).error is None
        finally:
            spent.close()
        over = rt.invoke("orders.refund", {"amount": 100}, actor=token, idempotency_key="r-2")
    finally:
        rt.close()
    assert over.error is not None and over.error.code == "RATE_LIMITED"
    assert over.error.details is not None and over.error.details["retry_after_ms"] > 3_600_000
    assert over.attempt == 1, "answered without waiting to retry"


def test_a_call_over_what_is_left_is_limited_before_approval_is_asked(
    limited: Plant, service: Service
) -> None:
    rt = service.runtime(limited.target)
    token = limited.token("bot-7", tenant="acme")
    try:
        envelope = rt.invoke("orders.refund", {"amount": 3000}, actor=token)
        assert envelope.status == "succeeded"
        over = rt.invoke("orders.refund", {"amount": 4500}, actor=token)
    finally:
        rt.close()
    # 4500 needs approval, but fits the budget only tomorrow: no approval is asked.
    assert over.status == "failed" and over.error is not None
    assert over.error.code == "RATE_LIMITED"
    assert limited.events(kind="approval") == []


def test_a_call_over_the_whole_budget_is_policy_denied(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "limits.yaml").write_text(
        POLICIES.replace("    when: input.amount > 4000", "    when: false")
    )
    plant = start_plane(folder, watch_policies=False)
    service = Service()
    rt = service.runtime(plant.target)
    rt.register()
    try:
        envelope = rt.invoke("orders.refund", {"amount": 6000}, actor=plant.token())
    finally:
        rt.close()
    assert envelope.status == "failed" and envelope.error is not None
    assert envelope.error.code == "POLICY_DENIED"
    assert envelope.error.public_message.startswith("Today's refund budget is spent")
    row = decision(plant, envelope.invocation_id)
    assert row["reason"] == "over-whole-budget:refund-budget-per-tenant"
    assert service.refunds == 0


def test_an_approved_resume_refused_by_a_budget_is_recorded_whole(
    limited: Plant, service: Service
) -> None:
    """The decision names the approval the call presented and the approval's
    refusal names the call's capability, though the limit refused it before
    the approval stage ran."""
    rt = service.runtime(limited.target)
    token = limited.token("bot-7", tenant="acme")
    try:
        suspended = rt.invoke("orders.refund", {"amount": 4500}, actor=token)
        assert suspended.status == "suspended" and suspended.approval_id
        with warden.Approvals(
            limited.target, token=limited.token("mia", roles=("manager",), tenant="acme")
        ) as approvals:
            approvals.approve(suspended.approval_id)
        assert rt.invoke("orders.refund", {"amount": 3000}, actor=token).status == "succeeded"
        resumed = rt.invoke(
            "orders.refund", {"amount": 4500}, actor=token, approval_id=suspended.approval_id
        )
    finally:
        rt.close()
    assert resumed.error is not None and resumed.error.code == "RATE_LIMITED"
    row = decision(limited, resumed.invocation_id)
    assert row["approval_id"] == suspended.approval_id
    (refused,) = limited.events(kind="approval", status="refused")
    assert (refused["capability_id"], refused["service"]) == ("orders.refund", "orders")
    assert refused["capability_version"] and refused["invocation_id"] == resumed.invocation_id


def test_a_call_needing_approval_reserves_its_cost_only_when_granted(
    limited: Plant, service: Service
) -> None:
    rt = service.runtime(limited.target)
    token = limited.token("bot-7", tenant="acme")
    try:
        suspended = rt.invoke("orders.refund", {"amount": 4500}, actor=token)
        assert suspended.status == "suspended"
        # Nothing reserved: the whole budget is still there.
        fits = rt.invoke("orders.refund", {"amount": 4000}, actor=token)
    finally:
        rt.close()
    assert fits.status == "succeeded"


def test_a_concurrency_cap_holds_with_long_handlers_and_frees_at_outcome(
    limited: Plant, service: Service
) -> None:
    rt = service.runtime(limited.target)
    token = limited.token("bot-7", tenant="acme")
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            first = [pool.submit(rt.invoke, "orders.export", {"n": i}, actor=token) for i in (1, 2)]
            assert service.running.acquire(timeout=10) and service.running.acquire(timeout=10)
            third = rt.invoke("orders.export", {"n": 3}, actor=token)
            assert third.status == "failed" and third.error is not None
            assert third.error.code == "RATE_LIMITED"
            assert third.error.details is not None and third.error.details["retry_after_ms"] > 0
            service.gate.set()
            assert [f.result(timeout=30).status for f in first] == ["succeeded"] * 2
        limited.await_outcome_reports()
        fourth = rt.invoke("orders.export", {"n": 4}, actor=token)
    finally:
        rt.close()
    assert fourth.status == "succeeded"
    row = decision(limited, third.invocation_id)
    assert row["reason"] == "limited-by:exports-in-flight"


def _begin(
    plant: Plant, token: str, capability_id: str = "orders.export", input_json: str = '{"n": 1}'
) -> str:
    """Begin a call and never report its outcome."""
    with grpc.insecure_channel(plant.target) as channel:
        response = governor_pb2_grpc.GovernorStub(channel).Begin(
            governor_pb2.BeginRequest(
                invocation_id=str(uuid.uuid4()),
                capability_id=capability_id,
                actor_token=token,
                input_json=input_json,
            ),
            metadata=(("x-warden-service-token", ORDERS_TOKEN),),
            timeout=10,
        )
    return response.WhichOneof("outcome") or ""


@pytest.mark.single_process
def test_a_concurrency_slot_frees_when_its_grant_expires_without_an_outcome(
    limited: Plant, service: Service
) -> None:
    token = limited.token("bot-7", tenant="acme", ttl=7200)
    assert [_begin(limited, token) for _ in range(3)] == ["grant", "grant", "failure"]
    plane = limited.server.plane
    later = plane.clock() + timedelta(hours=1)
    plane.clock = lambda: later
    assert _begin(limited, token) == "grant"


def test_audit_mode_limits_record_what_they_would_have_limited(
    limited: Plant, service: Service
) -> None:
    rt = service.runtime(limited.target)
    token = limited.token("bot-9", tenant="other")
    try:
        answers = [rt.invoke("orders.ping", {}, actor=token) for _ in range(2)]
    finally:
        rt.close()
    assert [a.status for a in answers] == ["succeeded", "succeeded"]
    first = json.loads(decision(limited, answers[0].invocation_id)["rules"])["limits"]
    second = json.loads(decision(limited, answers[1].invocation_id)["rules"])["limits"]
    assert "limited" not in first
    assert second["limited"][0]["id"] == "pings-rollout"
    assert second["limited"][0]["mode"] == "audit"


def _status(plant: Plant, *args: str, roles: tuple[str, ...] = ("auditor:all",)) -> Result:
    token = plant.token("aud", roles=roles, tenant="acme")
    return CliRunner().invoke(
        main, ["limits", "status", "--target", plant.target, "--token", token, *args]
    )


def test_limits_status_shows_each_keys_usage_through_the_audit_api(
    limited: Plant, service: Service
) -> None:
    rt = service.runtime(limited.target)
    try:
        for tenant, amount in (("acme", 730), ("acme", 100), ("globex", 50)):
            token = limited.token("bot-7", tenant=tenant)
            assert rt.invoke("orders.refund", {"amount": amount}, actor=token).status == "succeeded"
    finally:
        rt.close()
    limited.await_outcome_reports()
    every = _status(limited, "--limit", "refund-budget-per-tenant", "--json")
    assert every.exit_code == 0, every.output
    (line,) = every.output.splitlines()
    status = json.loads(line)
    assert (status["kind"], status["capacity"], status["mode"]) == ("budget", 5000, "enforce")
    assert [(k["key"], k["used"]) for k in status["keys"]] == [("acme", 830), ("globex", 50)]
    assert all(k["next_release_ms"] > 0 for k in status["keys"])
    one = _status(limited, "--key", "globex")
    assert one.exit_code == 0, one.output
    assert "refund-budget-per-tenant: budget 5000 per 86400s" in one.output
    assert "  globex: 50 of 5000, next release in" in one.output
    assert "acme" not in one.output
    reads = limited.events(kind="access", status="allowed")
    assert [r["reason"] for r in reads] == ["audit.limits"] * 2
    assert json.loads(reads[1]["input"]) == {"key": "globex"}


def test_limits_status_needs_an_auditor_of_every_tenant(limited: Plant) -> None:
    refused = _status(limited, roles=("auditor",))
    assert refused.exit_code == 1
    assert "PERMISSION_DENIED" in refused.output and "auditor:all" in refused.output
    unknown = _status(limited, "--limit", "nope")
    assert unknown.exit_code == 1
    assert "no limit 'nope' in force" in unknown.output


@pytest.mark.single_process
def test_metrics_count_refusals_and_usage_per_limit_id_never_per_key(
    limited: Plant, service: Service
) -> None:
    rt = service.runtime(limited.target)
    token = limited.token("bot-7", tenant="acme")
    try:
        answers = [rt.invoke("orders.refund", {"amount": 2000}, actor=token) for _ in range(3)]
    finally:
        rt.close()
    assert [a.status for a in answers] == ["succeeded", "succeeded", "failed"]
    exposition = limited.server.plane.telemetry.metrics.exposition().decode()
    assert 'warden_limit_refusals_total{limit="refund-budget-per-tenant"} 1.0' in exposition
    assert 'warden_limit_usage_ratio{limit="refund-budget-per-tenant"} 0.8' in exposition
    assert 'warden_limit_keys_in_use{limit="refund-budget-per-tenant"} 1.0' in exposition
    assert "acme" not in exposition


def test_si5_a_limit_keyed_by_a_sensitive_field_keeps_it_out_of_the_store(
    limited: Plant, service: Service
) -> None:
    card = '{"card": "4111222233334444"}'
    assert _begin(limited, limited.token(), "orders.charge", card) == "grant"
    # The same card again: counted under the same (stored) key.
    assert _begin(limited, limited.token(), "orders.charge", card) == "failure"
    (row,) = limited.events(kind="decision", status="granted")
    counted = json.loads(row["rules"])["limits"]["counted"]
    # A key that only holds the value ("card-" + input.card) is kept out too.
    assert sorted((c["id"], c["key"]) for c in counted) == [
        ("charges-per-card", "[REDACTED]"),
        ("one-card-at-a-time", "[REDACTED]"),
    ]
    everything = [
        limited.rows(f"SELECT * FROM {table}")
        for table in ("audit_events", "limit_holds", "limit_buckets")
    ]
    assert len(everything[1]) == 1 and len(everything[2]) == 1
    assert "4111222233334444" not in json.dumps(everything)


KEYED_BY_CONTEXT = """
rules:
  - id: allow-all
    capabilities: ["orders.*"]
    effect: allow
limits:
  - id: pings-per-caller-key
    capabilities: ["orders.ping"]
    key: context.k
    rate: 1/hour
    burst: 1
"""


def test_a_limit_key_that_is_no_string_when_decided_fails_closed(
    start_plane: Callable[..., Plant], policy_dir: Callable[[str], Path]
) -> None:
    """The folder check holds a key to be a string; a dynamic one that is 123
    when a call is decided fails closed rather than share the count of "123"."""
    plant = start_plane(policy_dir(KEYED_BY_CONTEXT), watch_policies=False)
    rt = Service().runtime(plant.target)
    token = plant.token("bot-7", tenant="acme")
    try:
        text = rt.invoke("orders.ping", {}, actor=token, context={"k": "123"})
        number = rt.invoke("orders.ping", {}, actor=token, context={"k": 123})
        again = rt.invoke("orders.ping", {}, actor=token, context={"k": "123"})
    finally:
        rt.close()
    assert text.status == "succeeded"
    assert number.error is not None and number.error.code == "POLICY_FAILED"
    assert decision(plant, number.invocation_id)["reason"] == "limit-error:pings-per-caller-key"
    assert again.error is not None and again.error.code == "RATE_LIMITED"
