"""Audit mode and message_expr, end to end through invoke and the audit log."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import warden
from tests.conftest import EXAMPLE_POLICIES, Plant, make_config
from tests.integration.lab import Lab, build_lab
from warden_server.plane import Plane
from warden_server.policy.loader import PolicyLoadError
from warden_server.registry import Registry
from warden_server.reload import announce_joined, load_at_start
from warden_server.store import SQLiteStore

RULES = """
rules:
  - id: allow-all
    capabilities: ["orders.*"]
    effect: allow
  - id: big-numbers
    capabilities: ["orders.echo"]
    effect: deny
    when: input.n > 100
    message_expr: '"Use at most 100, not " + string(input.n) + "."'
    message: Use at most 100.
  - id: thirteen
    capabilities: ["orders.echo"]
    effect: deny
    when: input.n == 13
    message_expr: '"Not " + actor.attrs.missing'
    message: Thirteen is unlucky.
  - id: notes-rollout
    capabilities: ["orders.echo"]
    effect: deny
    mode: audit
    when: input.note == "rollout"
    message: Notes like this will be refused.
"""


def decision_rules(plant: Plant, invocation_id: str) -> dict[str, Any]:
    (row,) = plant.events(invocation_id=invocation_id, kind="decision")
    return json.loads(row["rules"])


def lab_with(start_plane: Callable[..., Plant], tmp_path: Path) -> tuple[Plant, warden.Runtime]:
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "rules.yaml").write_text(RULES)
    plant = start_plane(folder, watch_policies=False)
    rt = build_lab(plant.target, "test-orders-token", Lab())
    rt.register()
    return plant, rt


def test_message_expr_builds_the_public_message(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    plant, rt = lab_with(start_plane, tmp_path)
    env = rt.invoke("orders.echo", {"n": 250}, actor=plant.token())
    rt.close()
    assert env.error is not None and env.error.code == "POLICY_DENIED"
    assert env.error.public_message == "Use at most 100, not 250."


def test_a_failing_message_expr_falls_back_and_the_failure_is_recorded(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    plant, rt = lab_with(start_plane, tmp_path)
    env = rt.invoke("orders.echo", {"n": 13}, actor=plant.token())
    rt.close()
    assert env.error is not None and env.error.code == "POLICY_DENIED"
    assert env.error.public_message == "Thirteen is unlucky."
    rules = decision_rules(plant, env.invocation_id)
    (thirteen,) = [r for r in rules["evaluated"] if r["id"] == "thirteen"]
    assert thirteen["matched"] is True and "message_error" in thirteen


def test_audit_mode_records_what_it_would_have_done_without_enforcing(
    start_plane: Callable[..., Plant], tmp_path: Path
) -> None:
    plant, rt = lab_with(start_plane, tmp_path)
    env = rt.invoke("orders.echo", {"n": 5, "note": "rollout"}, actor=plant.token())
    plain = rt.invoke("orders.echo", {"n": 5, "note": "fine"}, actor=plant.token())
    rt.close()
    assert env.status == "succeeded" and plain.status == "succeeded"
    rules = decision_rules(plant, env.invocation_id)
    assert rules["decided_by"] == "allow-all"
    assert rules["would_have"] == {
        "effect": "deny",
        "rule": "notes-rollout",
        "message": "Notes like this will be refused.",
    }
    (rollout,) = [r for r in rules["evaluated"] if r["id"] == "notes-rollout"]
    assert rollout == {"id": "notes-rollout", "effect": "deny", "mode": "audit", "matched": True}
    assert "would_have" not in decision_rules(plant, plain.invocation_id)


def test_the_plane_records_the_set_it_started_with(plant: Plant) -> None:
    (row,) = plant.events(kind="policy")
    assert (row["status"], row["reason"]) == ("loaded", "startup")
    assert row["policy_revision"] == plant.server.plane.policies.current().revision
    assert json.loads(row["details"])["files"] == ["orders.yaml"]


def test_a_joining_process_announces_only_a_set_the_first_did_not(
    tmp_path: Path, policy_dir: Callable[[str], Path]
) -> None:
    """The processes of a plane load their sets at the same time; the first
    records its own, and one that joins records nothing unless its set differs
    (the folder changed while they loaded)."""
    config = make_config(tmp_path, EXAMPLE_POLICIES)
    store = SQLiteStore(config.store_path)
    try:
        registry = Registry(store, config.limits)
        joining = load_at_start(config, store, registry, joining=True)
        assert list(store.audit_records()) == []
        first = load_at_start(config, store, registry)
        announce_joined(store, joining)
        assert _policy_rows(store) == [("loaded", "startup", first.revision)]

        changed = make_config(tmp_path, policy_dir(RULES))
        later = load_at_start(changed, store, registry, joining=True)
        announce_joined(store, later)
        announce_joined(store, later)
        assert _policy_rows(store) == [
            ("loaded", "startup", first.revision),
            ("loaded", "startup", later.revision),
        ]
    finally:
        store.close()


def _policy_rows(store: SQLiteStore) -> list[tuple[str, str, str]]:
    return [
        (r["status"], r["reason"], r["policy_revision"])
        for r in store.audit_records()
        if r["kind"] == "policy"
    ]


def test_a_plane_refuses_to_start_on_a_broken_set_and_records_why(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "rules.yaml").write_text("rules:\n  - id: x\n    capabilities: [orders.get]\n")
    config = make_config(tmp_path, folder)
    with pytest.raises(PolicyLoadError) as raised:
        Plane.from_config(config)
    assert str(raised.value) == f"{folder}/rules.yaml:2:5: rules[0].effect: missing required key"
    store = SQLiteStore(config.store_path)
    try:
        (row,) = store.audit_records()
    finally:
        store.close()
    assert (row["kind"], row["status"], row["reason"]) == ("policy", "rejected", "startup")
    assert row["cause_message"] == str(raised.value)


FAILING_AT_RUN_TIME = """
rules:
  - id: allow-all
    capabilities: ["orders.*"]
    effect: allow
  - id: level-compared-with-number
    capabilities: ["orders.echo"]
    effect: deny
    when: actor.attrs.level > 5
  - id: missing-claim
    capabilities: ["orders.echo"]
    effect: deny
    when: actor.attrs.nickname == "x"
  - id: divides-by-zero
    capabilities: ["orders.echo"]
    effect: deny
    when: input.n / (input.n - 13) > 0
"""


@pytest.mark.parametrize("evaluator", ["cel-cpp", "cel-python"])
def test_si5_a_rule_failing_at_run_time_leaves_one_line_in_words_in_the_audit_log(
    start_plane: Callable[..., Plant], tmp_path: Path, evaluator: str
) -> None:
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "rules.yaml").write_text(FAILING_AT_RUN_TIME)
    plant = start_plane(folder, watch_policies=False, evaluator=evaluator)
    rt = build_lab(plant.target, "test-orders-token", Lab())
    rt.register()
    secret = "claim-value-7f3a9"
    env = rt.invoke(
        "orders.echo", {"n": 13, "note": "input-value-c41d"}, actor=plant.token(level=secret)
    )
    rt.close()
    assert env.error is not None and env.error.code == "POLICY_FAILED"
    (row,) = plant.events(invocation_id=env.invocation_id, kind="decision")
    errors = {r["id"]: r["error"] for r in json.loads(row["rules"])["evaluated"] if "error" in r}
    assert errors == {
        "level-compared-with-number": "no operator '>' for (string, int)",
        "missing-claim": "no such key: nickname",
        "divides-by-zero": "division by zero",
    }
    for private in (secret, "input-value-c41d", "bot-7", "acme", "celpy", "<class", "0x"):
        assert private not in row["rules"], private
