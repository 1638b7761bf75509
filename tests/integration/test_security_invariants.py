"""SPEC §4: the security invariants this foundation carries, one test (or more)
named after each, against the real plane."""

from __future__ import annotations

import itertools
import json
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.approving import held_writer
from tests.integration.lab import EchoIn, EchoOut, Lab, build_lab
from warden.shared.canonical import digest
from warden.v1 import governor_pb2, governor_pb2_grpc
from warden_server.audit.chain import verify_rows
from warden_server.store import SQLiteStore

SERVICE = (("x-warden-service-token", ORDERS_TOKEN),)


def begin(
    plant: Plant,
    capability: str,
    arguments: Any,
    *,
    actor: str,
    surface: str = "",
    raw_input: str | None = None,
) -> governor_pb2.BeginResponse:
    with grpc.insecure_channel(plant.target) as channel:
        stub = governor_pb2_grpc.GovernorStub(channel)
        return stub.Begin(
            governor_pb2.BeginRequest(
                invocation_id=str(uuid.uuid4()),
                capability_id=capability,
                actor_token=actor,
                input_json=raw_input if raw_input is not None else json.dumps(arguments),
                surface=surface,
            ),
            metadata=SERVICE,
        )


# -- SI-1 fail closed -------------------------------------------------------


@pytest.mark.fixed_processes
def test_si1_plane_unreachable_means_governance_unavailable_and_no_execution(lab: Lab) -> None:
    rt = build_lab("127.0.0.1:9", ORDERS_TOKEN, lab, governance_timeout_ms=300)
    try:
        env = rt.invoke("orders.echo", {"n": 1}, actor="any")
    finally:
        rt.close()
    assert env.error is not None and env.error.code == "GOVERNANCE_UNAVAILABLE"
    assert env.error.retryable
    assert lab.count("echo") == 0


def test_si1_plane_gone_after_registration_fails_closed(
    lab_plant: Plant, lab: Lab, lab_rt: warden.Runtime
) -> None:
    token = lab_plant.token()
    lab_plant.server.stop(grace=0)
    env = lab_rt.invoke("orders.echo", {"n": 1}, actor=token)
    assert env.error is not None and env.error.code == "GOVERNANCE_UNAVAILABLE"
    assert lab.count("echo") == 0


def test_si1_plane_refusing_the_service_fails_closed_without_false_retry_advice(
    lab_plant: Plant, lab: Lab
) -> None:
    rt = build_lab(lab_plant.target, "not-a-service-token", lab)
    try:
        env = rt.invoke("orders.echo", {"n": 1}, actor=lab_plant.token())
    finally:
        rt.close()
    assert env.error is not None and env.error.code == "GOVERNANCE_UNAVAILABLE"
    assert env.error.retryable is False
    assert lab.count("echo") == 0


@pytest.mark.parametrize(
    ("capability", "arguments", "roles"),
    [
        ("orders.missing", {"n": 1}, ("support",)),
        ("orders.secret", {"n": 1}, ("support",)),
        ("orders.mcp_only", {"n": 1}, ("support",)),
        ("orders.echo", {"n": -5}, ("support",)),
        ("orders.admin", {"n": 1}, ("support",)),
        ("orders.echo", {"n": 500}, ("support",)),
        ("orders.echo", {"n": 13}, ("support",)),
        ("orders.echo", {"n": 42}, ("support",)),
        ("orders.echo", {"n": 1}, ("nobody",)),
    ],
)
def test_si1_no_handler_runs_without_a_grant(
    lab_rt: warden.Runtime,
    lab_plant: Plant,
    lab: Lab,
    capability: str,
    arguments: dict[str, Any],
    roles: tuple[str, ...],
) -> None:
    env = lab_rt.invoke(capability, arguments, actor=lab_plant.token(roles=roles))
    assert env.status in ("failed", "suspended")
    assert sum(lab.runs.values()) == 0


def test_si1_grant_is_bound_to_invocation_capability_version_actor_and_digest(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    response = begin(
        lab_plant, "orders.echo", {"note": "x", "n": 5}, actor=lab_plant.token(sub="alice")
    )
    assert response.WhichOneof("outcome") == "grant"
    claims = lab_plant.server.plane.grants.verify(response.grant.token)
    assert claims.invocation_id == response.invocation_id
    assert (claims.capability_id, claims.capability_version) == ("orders.echo", "1")
    assert claims.actor_id == "alice"
    assert claims.input_digest == digest({"n": 5, "note": "x"}) == response.grant.input_digest

    other = begin(lab_plant, "orders.echo", {"n": 6}, actor=lab_plant.token())
    with grpc.insecure_channel(lab_plant.target) as channel:
        stub = governor_pb2_grpc.GovernorStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Complete(
                governor_pb2.CompleteRequest(
                    invocation_id=other.invocation_id,
                    grant_token=response.grant.token,
                    status=governor_pb2.OUTCOME_STATUS_SUCCEEDED,
                ),
                metadata=SERVICE,
            )
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "another invocation" in (raised.value.details() or "")


# -- SI-2 validate before policy ---------------------------------------------


def test_si2_policies_never_see_input_that_failed_validation(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    # `input.n > 100` would raise on a string; validation must stop it first.
    env = lab_rt.invoke("orders.echo", {"n": "lots"}, actor=lab_plant.token())
    assert env.error is not None and env.error.code == "INPUT_INVALID"
    (row,) = lab_plant.events(invocation_id=env.invocation_id)
    assert row["rules"] is None, "no policy rule was evaluated"
    assert row["stage"] == "input-validation"


def test_si2_the_handler_receives_exactly_the_validated_input(
    lab_rt: warden.Runtime, lab_plant: Plant, lab: Lab
) -> None:
    env = lab_rt.invoke("orders.echo", {"n": 9, "note": "ünïcode"}, actor=lab_plant.token())
    assert env.status == "succeeded"
    assert lab.inputs == [EchoIn(n=9, note="ünïcode")]
    (granted,) = lab_plant.events(invocation_id=env.invocation_id, kind="decision")
    assert granted["input_digest"] == digest({"n": 9, "note": "ünïcode"})


# -- SI-3 one audit trail ------------------------------------------------------


def test_si3_every_attempt_produces_audit_records(lab_rt: warden.Runtime, lab_plant: Plant) -> None:
    calls = [
        ("orders.missing", {"n": 1}, ("support",)),
        ("orders.secret", {"n": 1}, ("support",)),
        ("orders.echo", {"n": 500}, ("support",)),
        ("orders.echo", {"n": 42}, ("support",)),
        ("orders.echo", {"n": "x"}, ("support",)),
        ("orders.echo", {"n": 1, "note": "explode"}, ("support",)),
        ("orders.echo", {"n": 1}, ("support",)),
    ]
    envelopes = [lab_rt.invoke(c, a, actor=lab_plant.token(roles=r)) for c, a, r in calls]
    for env in envelopes:
        decisions = lab_plant.events(invocation_id=env.invocation_id, kind="decision")
        assert len(decisions) == 1, env
    statuses = [
        lab_plant.events(invocation_id=e.invocation_id, kind="decision")[0]["status"]
        for e in envelopes
    ]
    assert statuses == ["failed", "failed", "failed", "suspended", "failed", "granted", "granted"]
    for env in envelopes[-2:]:
        assert len(lab_plant.events(invocation_id=env.invocation_id, kind="outcome")) == 1


def test_si3_decision_record_is_committed_before_the_grant_returns(
    lab_plant: Plant, lab: Lab
) -> None:
    """The store's writer is held for the whole call, so a grant returned before
    its decision record commits (a commit left to finish in the background)
    would reach the handler every time, not only when the commit is slow."""
    store = lab_plant.server.plane.store
    assert isinstance(store, SQLiteStore)
    rt = build_lab(
        lab_plant.target,
        ORDERS_TOKEN,
        lab,
        # The held call waits all of it; registering first must not (500 ms
        # was too short for a Register on a busy two-core machine).
        governance_timeout_ms=2_000,
        retry=warden.RetryPolicy(max_attempts=1),
    )
    try:
        rt.register()
        # Holding the writer holds every process's: they take turns through one lock.
        with held_writer(store):
            env = rt.invoke("orders.echo", {"n": 1}, actor=lab_plant.token())
    finally:
        rt.close()
    assert env.error is not None and env.error.code == "GOVERNANCE_UNAVAILABLE", env
    assert lab.count("echo") == 0


def test_si3_decision_record_is_on_disk_when_the_handler_runs(lab_plant: Plant) -> None:
    seen: list[dict[str, Any]] = []
    rt = warden.Runtime(lab_plant.target, service="orders", token=ORDERS_TOKEN)

    @rt.capability("orders.peek", input=EchoIn, output=EchoOut, side_effect="read")
    def peek(inp: EchoIn, ctx: warden.Context) -> EchoOut:
        # The handler only runs after the grant arrived: its decision must be on disk.
        seen.extend(
            lab_plant.rows(
                "SELECT * FROM audit_events WHERE invocation_id = ?", (ctx.invocation_id,)
            )
        )
        return EchoOut(n=inp.n)

    try:
        env = rt.invoke("orders.peek", {"n": 1}, actor=lab_plant.token())
    finally:
        rt.close()
    assert env.status == "succeeded"
    assert [(r["kind"], r["status"]) for r in seen] == [("decision", "granted")]


def test_si3_a_grant_whose_transaction_fails_is_never_returned(lab_plant: Plant, lab: Lab) -> None:
    """The store failing the grant's transaction (as a full disk does at commit)
    fails the call closed: no grant without its decision record."""
    conn = sqlite3.connect(lab_plant.db_path)
    try:
        # A real failure inside the plane's own transaction: the trigger rolls the
        # whole transaction back, and the plane's commit of it fails.
        conn.execute(
            "CREATE TRIGGER disk_full BEFORE INSERT ON audit_events "
            "WHEN NEW.kind = 'decision' AND NEW.status = 'granted' AND NEW.actor_id = 'doomed' "
            "BEGIN SELECT RAISE(ROLLBACK, 'database or disk is full'); END"
        )
        conn.commit()
    finally:
        conn.close()
    rt = build_lab(lab_plant.target, ORDERS_TOKEN, lab, retry=warden.RetryPolicy(max_attempts=1))
    try:
        rt.register()
        env = rt.invoke("orders.echo", {"n": 1}, actor=lab_plant.token(sub="doomed"))
        fine = rt.invoke("orders.echo", {"n": 2}, actor=lab_plant.token(sub="fine"))
    finally:
        rt.close()
    assert env.error is not None and env.error.code == "GOVERNANCE_UNAVAILABLE", env
    assert lab.inputs == [EchoIn(n=2)], "only the call whose grant committed ran"
    assert fine.status == "succeeded"
    assert lab_plant.events(invocation_id=env.invocation_id, status="granted") == []


# -- SI-4 tamper evidence (the chain links) ------------------------------------


def _populated(lab_rt: warden.Runtime, lab_plant: Plant) -> Path:
    for n in range(4):
        lab_rt.invoke("orders.echo", {"n": n}, actor=lab_plant.token())
    return lab_plant.db_path


def _verify(db: Path) -> Any:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return verify_rows(dict(r) for r in conn.execute("SELECT * FROM audit_events ORDER BY seq"))
    finally:
        conn.close()


def _tamper(db: Path, *statements: str) -> None:
    conn = sqlite3.connect(db)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def test_si4_records_are_hash_chained(lab_rt: warden.Runtime, lab_plant: Plant) -> None:
    db = _populated(lab_rt, lab_plant)
    rows = lab_plant.rows()
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    assert rows[0]["prev_hash"] == "0" * 64
    for previous, row in itertools.pairwise(rows):
        assert row["prev_hash"] == previous["hash"]
    assert _verify(db).ok


def test_si4_an_edited_record_is_named(lab_rt: warden.Runtime, lab_plant: Plant) -> None:
    db = _populated(lab_rt, lab_plant)
    _tamper(db, "UPDATE audit_events SET status = 'succeeded' WHERE seq = 5")
    result = _verify(db)
    assert not result.ok and result.first_bad_seq == 5


def test_si4_a_deleted_record_is_named(lab_rt: warden.Runtime, lab_plant: Plant) -> None:
    db = _populated(lab_rt, lab_plant)
    _tamper(db, "DELETE FROM audit_events WHERE seq = 6")
    result = _verify(db)
    assert not result.ok and result.first_bad_seq == 6


def test_si4_reordered_records_are_named(lab_rt: warden.Runtime, lab_plant: Plant) -> None:
    db = _populated(lab_rt, lab_plant)
    _tamper(
        db,
        "UPDATE audit_events SET seq = -1 WHERE seq = 7",
        "UPDATE audit_events SET seq = 7 WHERE seq = 8",
        "UPDATE audit_events SET seq = 8 WHERE seq = -1",
    )
    result = _verify(db)
    assert not result.ok and result.first_bad_seq == 7


def test_si4_a_rehashed_edit_is_named_by_the_broken_link_after_it(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    from warden_server.records.chain import record_hash

    db = _populated(lab_rt, lab_plant)
    row = next(r for r in lab_plant.rows() if r["seq"] == 4)
    row["actor_id"] = "someone-else"
    forged = record_hash(row)
    _tamper(
        db, f"UPDATE audit_events SET actor_id = 'someone-else', hash = '{forged}' WHERE seq = 4"
    )
    result = _verify(db)
    assert not result.ok and result.first_bad_seq == 4
    assert "re-hashed" in (result.problem or "")


# -- SI-6 approval binding (the lifecycle's refusals: tests/integration/test_approvals.py) --


def _approved(lab_rt: warden.Runtime, lab_plant: Plant, arguments: dict[str, Any]) -> str:
    env = lab_rt.invoke("orders.echo", arguments, actor=lab_plant.token())
    assert env.status == "suspended" and env.approval_id
    with warden.Approvals(
        lab_plant.target, token=lab_plant.token(sub="mia", roles=("manager",))
    ) as approvals:
        approvals.approve(env.approval_id)
    return env.approval_id


def _resume(
    plant: Plant, arguments: Any, *, actor: str, approval_id: str, version: str = "1"
) -> governor_pb2.BeginResponse:
    with grpc.insecure_channel(plant.target) as channel:
        return governor_pb2_grpc.GovernorStub(channel).Begin(
            governor_pb2.BeginRequest(
                invocation_id=str(uuid.uuid4()),
                capability_id="orders.echo",
                capability_version=version,
                actor_token=actor,
                input_json=json.dumps(arguments),
                approval_id=approval_id,
            ),
            metadata=SERVICE,
        )


class EchoTaggedIn(EchoIn):
    tag: str = ""


def test_si6_an_approval_is_bound_to_capability_version_actor_and_input(
    lab_rt: warden.Runtime, lab_plant: Plant, lab: Lab
) -> None:
    approved = {"n": 42, "note": "as approved"}
    approval_id = _approved(lab_rt, lab_plant, approved)
    requester = lab_plant.token()
    changed = warden.Runtime(lab_plant.target, service="orders", token=ORDERS_TOKEN)
    changed.capability("orders.echo", input=EchoTaggedIn, output=EchoOut, side_effect="read")(
        lambda inp, ctx: EchoOut(n=inp.n)
    )
    try:
        (v2,) = changed.register()
    finally:
        changed.close()
    assert v2.version == "2"

    attempts = {
        "edited input": _resume(
            lab_plant, {"n": 42, "note": "edited"}, actor=requester, approval_id=approval_id
        ),
        "another actor": _resume(
            lab_plant, approved, actor=lab_plant.token(sub="bot-8"), approval_id=approval_id
        ),
        "the same id in another tenant": _resume(
            lab_plant, approved, actor=lab_plant.token(tenant="globex"), approval_id=approval_id
        ),
        "another version": _resume(
            lab_plant, approved, actor=requester, approval_id=approval_id, version="2"
        ),
        "unknown approval": _resume(lab_plant, approved, actor=requester, approval_id="f" * 32),
    }
    faces = {name: r.failure.SerializeToString(deterministic=True) for name, r in attempts.items()}
    assert all(r.WhichOneof("outcome") == "failure" for r in attempts.values())
    assert attempts["edited input"].failure.code == "APPROVAL_DENIED"
    assert len(set(faces.values())) == 1, "a mismatch reveals nothing about the approval"
    reasons = {
        name: lab_plant.events(invocation_id=r.invocation_id, kind="decision")[0]["reason"]
        for name, r in attempts.items()
    }
    assert reasons == {
        "edited input": "approval-not-bound:input_digest",
        "another actor": "approval-not-bound:requester",
        "the same id in another tenant": "approval-not-bound:tenant",
        "another version": "approval-not-bound:capability_version",
        "unknown approval": "approval-not-bound:unknown-id",
    }

    exact = _resume(lab_plant, approved, actor=requester, approval_id=approval_id)
    assert exact.WhichOneof("outcome") == "grant"
    assert exact.grant.input_digest == digest(approved)


def test_si6_an_approval_works_once(lab_rt: warden.Runtime, lab_plant: Plant, lab: Lab) -> None:
    arguments = {"n": 42, "note": "once"}
    approval_id = _approved(lab_rt, lab_plant, arguments)
    token = lab_plant.token()
    first = lab_rt.invoke("orders.echo", arguments, actor=token, approval_id=approval_id)
    second = lab_rt.invoke("orders.echo", arguments, actor=token, approval_id=approval_id)
    assert first.status == "succeeded"
    assert second.status == "failed" and second.error is not None
    assert second.error.code == "APPROVAL_DENIED"
    assert lab.count("echo") == 1
    (row,) = lab_plant.rows("SELECT state FROM approvals WHERE approval_id = ?", (approval_id,))
    assert row["state"] == "consumed"


# -- SI-8 concealment ------------------------------------------------------------


def test_si8_unknown_unexposed_and_hidden_are_identical(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    token = lab_plant.token()
    cases = {
        "unknown-capability": ("orders.nonexistent", ""),
        "unexposed-surface": ("orders.mcp_only", "openai"),
        "hidden-by-policy:lab-hide": ("orders.secret", ""),
    }
    faces = {}
    for reason, (capability, surface) in cases.items():
        response = begin(lab_plant, capability, {"n": 1}, actor=token, surface=surface)
        assert response.WhichOneof("outcome") == "failure"
        faces[reason] = response.failure.SerializeToString(deterministic=True)
        (row,) = lab_plant.events(invocation_id=response.invocation_id)
        assert row["reason"] == reason
        assert row["code"] == "CAPABILITY_NOT_FOUND" and row["stage"] == "discovery"
    assert len(set(faces.values())) == 1
    envelopes = [
        lab_rt.invoke(c, {"n": 1}, actor=token, surface=s or "direct") for c, s in cases.values()
    ]
    shapes = {json.dumps(e.error.to_model(), sort_keys=True) for e in envelopes if e.error}
    assert shapes == {
        json.dumps(
            {
                "code": "CAPABILITY_NOT_FOUND",
                "message": "Capability not found.",
                "retryable": False,
            },
            sort_keys=True,
        )
    }
    assert {(e.error.stage, e.error.expose_to_model) for e in envelopes if e.error} == {
        ("discovery", True)
    }


@pytest.mark.parametrize("token", ["", "not-a-jwt", "expired"])
def test_si8_a_caller_without_a_valid_token_learns_nothing_of_which_ids_exist(
    lab_rt: warden.Runtime, lab_plant: Plant, token: str
) -> None:
    """Authentication comes before resolution: a caller with no token, a bad
    one or an expired one meets the same UNAUTHENTICATED face whether the id
    exists, is unexposed, is hidden or was never registered."""
    if token == "expired":
        token = lab_plant.token(ttl=-3600)
    cases = {
        "exists": ("orders.echo", ""),
        "unknown": ("orders.nonexistent", ""),
        "unexposed": ("orders.mcp_only", "openai"),
        "hidden": ("orders.secret", ""),
        "malformed id": ("Not An Id!", ""),
    }
    faces = {}
    for name, (capability, surface) in cases.items():
        response = begin(lab_plant, capability, {"n": 1}, actor=token, surface=surface)
        assert response.WhichOneof("outcome") == "failure", name
        faces[name] = response.failure.SerializeToString(deterministic=True)
        (row,) = lab_plant.events(invocation_id=response.invocation_id)
        assert (row["code"], row["stage"]) == ("UNAUTHENTICATED", "authentication"), name
    assert len(set(faces.values())) == 1
    shapes = {
        json.dumps(e.error.to_model(), sort_keys=True)
        for c, s in cases.values()
        if (e := lab_rt.invoke(c, {"n": 1}, actor=token, surface=s or "direct")).error
    }
    assert len(shapes) == 1 and '"UNAUTHENTICATED"' in shapes.pop()


def test_si8_invalid_input_to_a_hidden_capability_reveals_nothing(
    lab_plant: Plant, lab_rt: warden.Runtime
) -> None:
    token = lab_plant.token()
    hidden = begin(lab_plant, "orders.secret", None, actor=token, raw_input="{not json")
    unknown = begin(lab_plant, "orders.nothing", None, actor=token, raw_input="{not json")
    assert hidden.failure.SerializeToString() == unknown.failure.SerializeToString()
    assert hidden.failure.code == "CAPABILITY_NOT_FOUND"


def test_si8_the_admin_sees_what_is_hidden_from_others(
    lab_plant: Plant, lab_rt: warden.Runtime
) -> None:
    env = lab_rt.invoke("orders.secret", {"n": 3}, actor=lab_plant.token(roles=("admin",)))
    assert env.status == "succeeded"


HIDDEN_AND_DENIED = """
rules:
  - id: allow
    capabilities: ["orders.*"]
    effect: allow
  - id: deny-mallory-and-dan
    capabilities: ["orders.echo"]
    effect: deny
    when: actor.id in ["mallory", "dan"]
    message: "Echo is closed to you."
  - id: hide-from-mallory
    capabilities: ["orders.echo"]
    effect: hide
    when: actor.id == "mallory"
"""


def test_si8_a_capability_both_hidden_and_denied_is_concealed(
    start_plane: Callable[..., Plant], policy_dir: Callable[[str], Path], lab: Lab
) -> None:
    """Hide beats deny (SPEC §6): an actor both rules match meets exactly the
    face of an unknown capability and never sees it listed, while the audit
    log records which rule hid it."""
    plant = start_plane(policy_dir(HIDDEN_AND_DENIED))
    rt = build_lab(plant.target, ORDERS_TOKEN, lab)
    try:
        rt.register()
        mallory, dan = plant.token(sub="mallory"), plant.token(sub="dan")
        hidden = rt.invoke("orders.echo", {"n": 1}, actor=mallory)
        unknown = rt.invoke("orders.nonexistent", {"n": 1}, actor=mallory)
        denied = rt.invoke("orders.echo", {"n": 1}, actor=dan)
        listed_for_mallory = [c.id for c in rt.discover(actor=mallory)]
        listed_for_dan = [c.id for c in rt.discover(actor=dan)]
    finally:
        rt.close()
    assert hidden.error is not None and unknown.error is not None
    assert hidden.error.to_model() == unknown.error.to_model()
    assert (hidden.error.code, hidden.error.stage) == ("CAPABILITY_NOT_FOUND", "discovery")
    hidden_face = begin(plant, "orders.echo", {"n": 1}, actor=mallory).failure
    unknown_face = begin(plant, "orders.nonexistent", {"n": 1}, actor=mallory).failure
    assert hidden_face.SerializeToString(deterministic=True) == unknown_face.SerializeToString(
        deterministic=True
    )
    assert "orders.echo" not in listed_for_mallory
    # The deny rule does match mallory: dan, whom only it matches, is denied openly.
    assert denied.error is not None and denied.error.code == "POLICY_DENIED"
    assert denied.error.public_message == "Echo is closed to you."
    assert "orders.echo" in listed_for_dan
    assert lab.count("echo") == 0
    (row,) = plant.events(invocation_id=hidden.invocation_id, kind="decision")
    assert row["reason"] == "hidden-by-policy:hide-from-mallory"
    assert json.loads(row["rules"])["decided_by"] == "hide-from-mallory"


# -- SI-9 two shapes -----------------------------------------------------------


def test_si9_every_failure_reaches_the_model_in_one_of_two_deterministic_shapes(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    exposed_keys = {"code", "message", "retryable"}
    concealed = {"code": "INTERNAL_ERROR", "message": "The operation failed."}
    calls = [
        ("orders.missing", {"n": 1}),
        ("orders.echo", {"n": -1}),
        ("orders.echo", {"n": 500}),
        ("orders.echo", {"n": 13}),
        ("orders.echo", {"n": 42}),
        ("orders.echo", {"n": 1, "note": "refuse"}),
        ("orders.echo", {"n": 1, "note": "explode"}),
        ("orders.echo", {"n": 1, "note": "lie"}),
        ("orders.admin", {"n": 1}),
    ]
    for capability, arguments in calls:
        first, second = (
            lab_rt.invoke(capability, arguments, actor=lab_plant.token()) for _ in range(2)
        )
        assert first.error is not None and second.error is not None
        shape = first.error.to_model()
        if first.error.expose_to_model:
            assert set(shape) in (exposed_keys, exposed_keys | {"details"})
        else:
            assert shape == concealed
        if first.status != "suspended":  # a suspension's details name its own approval
            assert json.dumps(shape) == json.dumps(second.error.to_model())


# -- SI-10 private stays private -------------------------------------------------


def test_si10_causes_and_stacks_never_cross_to_the_model_or_the_service(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    env = lab_rt.invoke("orders.echo", {"n": 1, "note": "explode"}, actor=lab_plant.token())
    assert env.error is not None and env.error.cause is not None
    model_face = json.dumps(env.error.to_model())
    assert "hunter2" not in model_face and "RuntimeError" not in model_face
    (row,) = lab_plant.events(invocation_id=env.invocation_id, kind="outcome")
    assert "hunter2" in row["cause_message"] and "Traceback" in row["stack"]
    assert row["cause_type"] == "builtins.RuntimeError"


def test_si10_policy_internals_never_reach_the_calling_service(
    lab_plant: Plant, lab_rt: warden.Runtime
) -> None:
    response = begin(lab_plant, "orders.echo", {"n": 13}, actor=lab_plant.token())
    assert response.failure.code == "POLICY_FAILED"
    wire = response.SerializeToString()
    for private in (b"lab-broken", b"divide", b"division", b"zero", b"policy-error"):
        assert private not in wire
    (row,) = lab_plant.events(invocation_id=response.invocation_id)
    assert "lab-broken" in row["reason"] and "division by zero" in row["rules"]


def test_si10_concealment_reasons_never_reach_the_calling_service(
    lab_plant: Plant, lab_rt: warden.Runtime
) -> None:
    response = begin(lab_plant, "orders.secret", {"n": 1}, actor=lab_plant.token())
    wire = response.SerializeToString()
    assert b"hidden" not in wire and b"lab-hide" not in wire
