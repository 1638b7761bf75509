"""The policy author's tools against a running plane: `warden policy status`,
`check --target/--store` with the registry's schemas, and the server's own
type-check of a reloaded set against registered capabilities."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.conftest import EXAMPLE_POLICIES, ORDERS_TOKEN, Plant
from tests.integration.test_policy_reload import wait_for, write_atomically
from warden_server.cli import main

MISSPELLED = """
rules:
  - id: misspelled-amount
    capabilities: ["orders.refund"]
    effect: deny
    when: input.amout > 500
"""
ILL_TYPED = """
rules:
  - id: amount-compared-with-text
    capabilities: ["orders.refund"]
    effect: deny
    when: input.amount > "500"
"""
ILL_TYPED_PROBLEM = (
    "rules[0].when: no operator '>' for (int, string): input.amount is an integer in "
    "orders.refund v1"
)
MISSPELLED_PROBLEM = (
    "rules[0].when: input.amout: input has no field 'amout' in the input schema of "
    "orders.refund v1 (fields: amount, order_id)"
)


def warden(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def started_with_orders(
    start_plane: Callable[..., Plant], tmp_path: Path, orders_example: ModuleType, **server: object
) -> Plant:
    folder = Path(shutil.copytree(EXAMPLE_POLICIES, tmp_path / "live"))
    plant = start_plane(folder, policy_debounce_ms=50, **server)
    rt = orders_example.build_runtime(plant.target, ORDERS_TOKEN)
    rt.register()
    rt.close()
    return plant


# Each process watches the folder and reports its own status: with several,
# the one that answers may not have read the change yet when another recorded
# it (test_processes.py waits for every process instead).
@pytest.mark.single_process
def test_status_shows_the_set_in_force_and_a_refused_change(
    start_plane: Callable[..., Plant], tmp_path: Path, orders_example: ModuleType
) -> None:
    plant = started_with_orders(start_plane, tmp_path, orders_example)
    folder = plant.config.policies_path
    token = plant.token("pat", roles=("policy-author",))
    revision = plant.server.plane.policies.current().revision

    result = warden("policy", "status", "--target", plant.target, "--token", token)
    assert result.exit_code == 0, result.output
    assert f"in force: revision {revision[:12]}, 7 rules in orders.yaml" in result.output
    assert f"folder: {folder} (watched)" in result.output
    assert "refused" not in result.output

    # The server type-checks a change against the registered capabilities.
    write_atomically(folder / "zz.yaml", MISSPELLED)
    wait_for(lambda: plant.events(kind="policy", status="rejected"), "the change to be refused")
    result = warden("policy", "status", "--target", plant.target, "--token", token)
    assert result.exit_code == 1, result.output
    assert "refused: revision" in result.output and "1 problem:" in result.output
    assert f"  {folder}/zz.yaml:6:11: {MISSPELLED_PROBLEM}" in result.output
    assert f"in force: revision {revision[:12]}" in result.output

    data = json.loads(
        warden("policy", "status", "--target", plant.target, "--token", token, "--json").output
    )
    assert data["current"]["revision"] == revision
    assert data["rejected"]["files"] == ["orders.yaml", "zz.yaml"]
    assert data["problems"] == [
        {
            "file": f"{folder}/zz.yaml",
            "line": 6,
            "column": 11,
            "path": "rules[0].when",
            "message": MISSPELLED_PROBLEM.removeprefix("rules[0].when: "),
        }
    ]


def test_status_needs_a_policy_reader_role(plant: Plant) -> None:
    result = warden("policy", "status", "--target", plant.target, "--token", plant.token())
    assert result.exit_code == 1
    assert (
        "PERMISSION_DENIED: reading the policy status needs one of the roles "
        "auditor, auditor:all, policy-author"
    ) in result.output
    result = warden("policy", "status", "--target", plant.target, "--token", "not-a-jwt")
    assert result.exit_code == 1 and "UNAUTHENTICATED" in result.output
    auditor = plant.token("audra", roles=("auditor",))
    assert warden("policy", "status", "--target", plant.target, "--token", auditor).exit_code == 0


def test_check_reads_input_schemas_from_a_plane_a_store_or_a_snapshot(
    start_plane: Callable[..., Plant], tmp_path: Path, orders_example: ModuleType
) -> None:
    plant = started_with_orders(start_plane, tmp_path, orders_example, watch_policies=False)
    token = plant.token("pat", roles=("policy-author",))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "rules.yaml").write_text(MISSPELLED)
    ill_typed = tmp_path / "ill-typed"
    ill_typed.mkdir()
    (ill_typed / "rules.yaml").write_text(ILL_TYPED)
    snapshot = tmp_path / "capabilities.json"
    exported = warden(
        "policy", "capabilities", "--target", plant.target, "--token", token, "--out", str(snapshot)
    )
    assert exported.exit_code == 0, exported.output
    assert json.loads(snapshot.read_text()) == json.loads(
        warden("policy", "capabilities", "--store", str(plant.db_path)).output
    )
    assert [c["id"] for c in json.loads(snapshot.read_text())["capabilities"]] == [
        "orders.export",
        "orders.get",
        "orders.refund",
    ]
    sources = {
        "target": ["--target", plant.target, "--token", token],
        "store": ["--store", str(plant.db_path)],
        "snapshot": ["--capabilities", str(snapshot)],
    }
    for name, source in sources.items():
        result = warden("policy", "check", str(broken), *source)
        assert result.exit_code == 1, (name, result.output)
        assert f"{broken}/rules.yaml:6:11: {MISSPELLED_PROBLEM}" in result.output, name
        result = warden("policy", "check", str(ill_typed), *source)
        assert result.exit_code == 1, (name, result.output)
        assert f"{ill_typed}/rules.yaml:6:24: {ILL_TYPED_PROBLEM}" in result.output, name
        good = warden("policy", "check", str(EXAMPLE_POLICIES), *source)
        assert good.exit_code == 0, (name, good.output)
        assert "input fields and types checked against 3 capabilities" in good.output, name
        assert "not checked" not in good.output, name
    # Without a source of schemas, input cannot be checked, and the check says so.
    unchecked = warden("policy", "check", str(ill_typed))
    assert unchecked.exit_code == 0
    assert "not checked: fields and types of input" in unchecked.output
    # A snapshot kept beside the policies is read without being named.
    shutil.copy(snapshot, ill_typed / "capabilities.json")
    result = warden("policy", "check", str(ill_typed))
    assert result.exit_code == 1
    assert f"{ill_typed}/rules.yaml:6:24: {ILL_TYPED_PROBLEM}" in result.output


def test_status_lists_the_rules_in_force_only_to_policy_readers(plant: Plant) -> None:
    folder = plant.config.policies_path
    token = plant.token("audra", roles=("auditor",))
    result = warden("policy", "status", "--target", plant.target, "--token", token, "--rules")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    listed = lines.index("rules in force:")
    assert lines[listed + 5].split() == [
        "refunds-over-500-need-a-manager",
        "require_approval",
        "orders.refund",
        f"{folder}/orders.yaml:22",
    ]
    assert lines[listed + 6].strip() == (
        "when: input.amount > c.approval_threshold && !v.is_manager"
    )
    assert lines[listed + 7].strip() == 'approvers: "manager" in approver.roles (open for 1h)'
    assert "agent-refunds-over-100-need-approval" in result.output
    assert "(audit mode: recorded, not enforced)" in result.output

    def status_json(*flags: str) -> dict[str, Any]:
        args = ("policy", "status", "--target", plant.target, "--token", token, "--json")
        return dict(json.loads(warden(*args, *flags).output))

    assert "rules_in_force" not in status_json()
    rules = status_json("--rules")["rules_in_force"]
    assert [r["id"] for r in rules] == [
        "orders-are-readable-in-the-tenant",
        "support-may-refund",
        "refunds-over-500-need-a-manager",
        "no-refunds-above-10000",
        "agent-refunds-over-100-need-approval",
        "export-is-invisible-to-non-admins",
        "admins-may-export",
    ]
    assert rules[0] == {
        "id": "orders-are-readable-in-the-tenant",
        "file": f"{folder}/orders.yaml",
        "line": 11,
        "effect": "allow",
        "mode": "enforce",
        "capabilities": ["orders.get"],
        "when": 'actor.tenant != ""',
        "message": None,
        "message_expr": None,
        "approvers": None,
        "ttl": None,
        "description": "Anyone of the order's tenant may look an order up.",
    }
    assert rules[4]["mode"] == "audit"

    refused = warden(
        "policy", "status", "--target", plant.target, "--token", plant.token(), "--rules"
    )
    assert refused.exit_code == 1
    assert "PERMISSION_DENIED: reading the policy status needs one of the roles" in refused.output
    assert "orders-are-readable" not in refused.output
