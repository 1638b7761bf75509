"""`warden policy explain`: one request through the example policies, offline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from warden_server.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "policies"
SNAPSHOT = {
    "capabilities": [
        {
            "id": "orders.refund",
            "version": "3",
            "service": "orders",
            "side_effect": "write",
            "tags": ["money"],
            "input_schema": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
                "required": ["order_id", "amount"],
                "additionalProperties": False,
            },
        }
    ]
}
SUPPORT_BOT = '{"sub": "bot-7", "roles": ["support"], "tenant": "acme"}'


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    """The example policies without their capabilities snapshot: explained
    with no schema to validate input against."""
    return Path(
        shutil.copytree(EXAMPLES, tmp_path / "bare", ignore=shutil.ignore_patterns("*.json"))
    )


def explain(*args: str) -> Result:
    return CliRunner().invoke(main, ["policy", "explain", *args])


def test_explain_shows_every_rule_its_value_and_the_precedence_that_decided(examples: Path) -> None:
    result = explain(
        str(examples),
        "--capability",
        "orders.refund",
        "--input",
        '{"order_id": "A1", "amount": 730}',
        "--actor-claims",
        SUPPORT_BOT,
    )
    assert result.exit_code == 0, result.output
    rules = f"{examples}/orders.yaml"
    assert result.stdout.splitlines() == [
        "orders.refund called by bot-7 (roles: support; tenant: acme)",
        "hide rules: none",
        "policy rules:",
        f"  support-may-refund                    allow             true   {rules}:17",
        # Variables and constants are shown written out, as evaluated.
        '                                        when: "support" in actor.roles || '
        '("manager" in actor.roles)',
        f"  refunds-over-500-need-a-manager       require_approval  true   {rules}:22",
        '                                        when: input.amount > 500 && !("manager" in '
        "actor.roles)",
        f"  no-refunds-above-10000                deny              false  {rules}:30",
        "                                        when: input.amount > 10000",
        f"  agent-refunds-over-100-need-approval  require_approval  true   {rules}:40"
        "  (audit mode: recorded, not enforced)",
        '                                        when: actor.id.startsWith("bot-") && '
        "input.amount > 100",
        "decision: require_approval, by refunds-over-500-need-a-manager",
        "  why: precedence hide > deny > require_approval > allow: "
        "'refunds-over-500-need-a-manager' (require_approval) decides over "
        "'support-may-refund' (allow)",
        "  message: Refunds above $500 require manager approval.",
    ]
    # Without a schema source the input is not validated, and the output says so.
    assert "not checked: the input against the capability's schema" in result.stderr


def test_explain_json_names_the_failing_rules_and_fails_closed(examples: Path) -> None:
    result = explain(
        str(examples),
        "--capability",
        "orders.refund",
        "--input",
        '{"order_id": "A1"}',
        "--actor-claims",
        SUPPORT_BOT,
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    values = {r["id"]: (r["value"], r["error"]) for r in data["rules"]}
    assert values == {
        "support-may-refund": (True, None),
        "refunds-over-500-need-a-manager": (None, "no such key: amount"),
        "no-refunds-above-10000": (None, "no such key: amount"),
        "agent-refunds-over-100-need-approval": (None, "no such key: amount"),
    }
    decision = data["decision"]
    assert (decision["effect"], decision["rule"]) == ("error", None)
    assert decision["reason"].startswith(
        "rules 'refunds-over-500-need-a-manager', 'no-refunds-above-10000' failed to evaluate"
    )


def test_explain_with_no_match_gives_the_default_effect(examples: Path) -> None:
    args = [str(examples), "--capability", "orders.get", "--actor-claims", '{"sub": "x"}']
    for default in ("deny", "allow"):
        result = explain(*args, "--default-effect", default, "--json")
        assert result.exit_code == 0, result.output
        decision = json.loads(result.stdout)["decision"]
        assert (decision["effect"], decision["rule"]) == (default, None)
        assert decision["reason"] == (
            f"no enforced rule matched: the default effect applies ({default})"
        )


def test_explain_shows_hide_deciding_first_and_the_other_rules_not_reached(examples: Path) -> None:
    result = explain(str(examples), "--capability", "orders.export", "--actor-claims", SUPPORT_BOT)
    assert result.exit_code == 0, result.output
    assert "policy rules: not reached" in result.stdout
    assert "decision: hide, by export-is-invisible-to-non-admins" in result.stdout
    assert "the call fails CAPABILITY_NOT_FOUND" in result.stdout


def test_explain_shows_what_audit_mode_rules_would_have_decided(examples: Path) -> None:
    result = explain(
        str(examples),
        "--capability",
        "orders.refund",
        "--input",
        '{"order_id": "A1", "amount": 120}',
        "--actor-claims",
        SUPPORT_BOT,
    )
    assert result.exit_code == 0, result.output
    assert "decision: allow, by support-may-refund" in result.stdout
    assert (
        "  with the audit-mode rules enforced: require_approval, "
        "by agent-refunds-over-100-need-approval"
    ) in result.stdout


def test_explain_validates_input_against_the_snapshot_beside_the_policies(
    tmp_path: Path,
) -> None:
    folder = Path(shutil.copytree(EXAMPLES, tmp_path / "policies"))
    (folder / "capabilities.json").write_text(json.dumps(SNAPSHOT))
    args = [str(folder), "--capability", "orders.refund", "--actor-claims", SUPPORT_BOT]
    result = explain(*args, "--input", '{"order_id": "A1", "amount": "730"}')
    assert result.exit_code == 0, result.output
    assert "orders.refund v3 called by bot-7" in result.stdout
    assert "input: /amount: must be of type integer" in result.stdout
    assert "decision: invalid" in result.stdout
    assert "policy rules: not reached" in result.stdout
    assert "not checked" not in result.stderr

    as_json = explain(*args, "--input", '{"order_id": "A1", "amount": 730}', "--json")
    data = json.loads(as_json.stdout)
    assert data["capability"]["tags"] == ["money"]
    assert data["decision"]["effect"] == "require_approval"

    unknown = explain(str(folder), "--capability", "orders.nope", "--actor-claims", SUPPORT_BOT)
    assert unknown.exit_code == 1
    assert f"orders.nope: no such capability in the snapshot {folder}/capabilities.json" in (
        unknown.output
    )


def test_explain_refuses_bad_arguments_with_one_clear_message(examples: Path) -> None:
    args = [str(examples), "--capability", "orders.get"]
    cases = [
        (["--actor-claims", "{nope"], "Invalid value for --actor-claims: not JSON"),
        (["--actor-claims", "[]"], "Invalid value for --actor-claims: must be a JSON object"),
        (["--actor-claims", '{"roles": []}'], "actor token has no subject"),
        (["--actor-claims", '{"sub": "x"}', "--now", "soon"], "Invalid value for --now"),
    ]
    for extra, message in cases:
        result = explain(*args, *extra)
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert "Traceback" not in result.output
