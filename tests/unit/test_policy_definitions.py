"""constants: and variables: in policy files: written out where used, decided
alike by both evaluators, and checked where written."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from warden_server.policy.cel import CelPythonEvaluator
from warden_server.policy.celcpp import CelCppEvaluator
from warden_server.policy.loader import PolicyLoadError, load_policies
from warden_server.policy.model import PolicyTest
from warden_server.policy.testing import disagreements, evaluate_case, run_policy_tests

RULES = """\
constants:
  threshold: 500
  teams: {refunds: ["support", "manager"]}
  ratio: 0.5
  greeting: "a \\"quoted\\" word"
variables:
  in_refunds_team: actor.roles.exists(r, r in c.teams.refunds)
  is_big: input.amount > c.threshold
  big_outsider: v.is_big && !v.in_refunds_team
  half: double(input.amount) * c.ratio
rules:
  - id: big-outsider-denied
    capabilities: ["orders.refund"]
    effect: deny
    when: v.big_outsider
    message_expr: c.greeting + " " + string(int(v.half))
  - id: team-allowed
    capabilities: ["orders.refund"]
    effect: require_approval
    when: v.in_refunds_team
    approvers: '"manager" in approver.roles && v.is_big'
"""
TESTS = """\
tests:
  - name: a big refund by an outsider is denied
    capability: orders.refund
    actor: {id: a, roles: [customer]}
    input: {amount: 900}
    expect: {effect: deny, rule: big-outsider-denied, message: 'a "quoted" word 450'}
  - name: the team asks for approval
    capability: orders.refund
    actor: {id: a, roles: [support]}
    input: {amount: 900}
    expect: {effect: require_approval, rule: team-allowed}
  - name: a small refund by an outsider is not denied
    capability: orders.refund
    actor: {id: a, roles: [customer]}
    input: {amount: 10}
    expect: {effect: deny, rule: null}
"""


def folder_with(tmp_path: Path, rules: str = RULES, tests: str = TESTS) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules.yaml").write_text(rules)
    (tmp_path / "tests" / "cases.yaml").write_text(tests)
    return tmp_path


@pytest.mark.parametrize("evaluator", [CelPythonEvaluator, CelCppEvaluator])
def test_variables_and_constants_decide_on_either_evaluator(
    tmp_path: Path, evaluator: type
) -> None:
    folder = folder_with(tmp_path)
    policies = load_policies(folder, evaluator=evaluator())
    report = run_policy_tests(policies, folder)
    assert [c.name for c in report.failed] == [], report.failed
    assert disagreements(policies, folder) == []
    rule = policies.rules[1]
    assert rule.text("approvers") == '"manager" in approver.roles && (input.amount > 500)'


def test_a_variable_is_written_out_in_parentheses(tmp_path: Path) -> None:
    """`v.a || v.b && ...` keeps the variable's own precedence."""
    rules = """\
variables:
  either: actor.id == "x" || actor.id == "y"
rules:
  - id: r
    capabilities: ["lab.read"]
    effect: allow
    when: v.either && actor.tenant == "t"
"""
    policies = load_policies(folder_with(tmp_path, rules, "tests: []\n"))
    assert policies.rules[0].text("when") == (
        '(actor.id == "x" || actor.id == "y") && actor.tenant == "t"'
    )
    case = PolicyTest.model_validate(
        {
            "name": "n",
            "capability": "lab.read",
            "actor": {"id": "x", "tenant": "other"},
            "expect": {"effect": "deny"},
        }
    )
    _, decision = evaluate_case(policies, case, datetime(2026, 1, 1, tzinfo=UTC))
    assert decision is not None and decision.effect == "deny"


def test_variables_belong_to_their_file(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("variables:\n  mine: 'true'\nrules: []\n")
    (tmp_path / "b.yaml").write_text(
        'rules:\n  - id: r\n    capabilities: ["lab.read"]\n    effect: allow\n    when: v.mine\n'
    )
    with pytest.raises(PolicyLoadError) as raised:
        load_policies(tmp_path)
    assert [str(p) for p in raised.value.problems] == [
        f"{tmp_path}/b.yaml:5:11: rules[0].when: unknown variable 'v.mine' "
        "(variables of this file: none)"
    ]


def test_a_name_that_is_not_an_identifier_is_refused_where_it_stands(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("constants:\n  big-refund: 5\nrules: []\n")
    with pytest.raises(PolicyLoadError) as raised:
        load_policies(tmp_path)
    assert "constants: 'big-refund' is not a name" in str(raised.value)
