"""`warden policy test`: the semantics suite, coverage, --run, --json and exit codes."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner, Result

from warden_server.cli import main
from warden_server.policy.loader import load_policies
from warden_server.policy.model import PolicyTest
from warden_server.policy.testing import evaluate_case

SEMANTICS = Path(__file__).resolve().parent.parent / "testdata" / "policy_semantics"
EXAMPLES = Path(__file__).resolve().parent.parent.parent / "policies"


def warden(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def copy_semantics(tmp_path: Path) -> Path:
    return Path(shutil.copytree(SEMANTICS, tmp_path / "policies"))


def test_semantics_suite_passes_and_an_erroring_rule_is_not_covered() -> None:
    """Every effect, precedence, the default, fail-closed, audit mode and
    message_expr fallback, as policy test data (tests/testdata/policy_semantics).
    The rule that fails closed never matches (it can only fail), so it is the
    one rule no case covers."""
    result = warden("policy", "test", str(SEMANTICS), "--min-coverage", "85")
    assert result.exit_code == 0, result.output
    assert (
        "11 passed, 0 failed; coverage 85% (rules 8/9, condition outcomes 22/26)" in result.output
    )
    assert "rules no test exercised: lab-broken-rule" in result.output
    assert "FAIL" not in result.output


def test_example_policies_pass_with_full_coverage() -> None:
    result = warden("policy", "test", str(EXAMPLES), "--min-coverage", "100")
    assert result.exit_code == 0, result.output
    assert (
        "0 failed; coverage 100% (rules 7/7, limits 2/2, condition outcomes 24/24)" in result.output
    )


def test_default_effect_applies_when_no_rule_matches() -> None:
    case = PolicyTest.model_validate(
        {"name": "n", "capability": "lab.read", "expect": {"effect": "allow"}}
    )
    now = datetime(2026, 3, 2, 12, tzinfo=UTC)
    for default in ("deny", "allow"):
        policies = load_policies(SEMANTICS, default_effect=default)
        _, decision = evaluate_case(policies, case, now)
        assert decision is not None
        assert (decision.effect, decision.rule) == (default, None)


def test_a_failing_case_exits_1_and_shows_expected_and_actual(tmp_path: Path) -> None:
    folder = copy_semantics(tmp_path)
    cases = folder / "tests" / "cases.yaml"
    cases.write_text(cases.read_text().replace("rule: lab-night-shift", "rule: lab-readers"))
    result = warden("policy", "test", str(folder))
    assert result.exit_code == 1
    assert "FAIL  now comes from the case" in result.output
    assert "expected {'effect': 'deny', 'rule': 'lab-readers'" in result.output
    assert "got      {'effect': 'deny', 'rule': 'lab-night-shift'" in result.output
    assert "10 passed, 1 failed" in result.output


def test_run_selects_cases_and_coverage_reports_unexercised_rules() -> None:
    result = warden("policy", "test", str(SEMANTICS), "--run", "hide beats")
    assert result.exit_code == 0, result.output
    assert result.output.count("PASS") == 1
    assert "rules no test exercised: lab-readers, lab-big-needs-approval," in result.output
    assert "coverage 5% (rules 1/9, condition outcomes 1/26)" in result.output


def test_coverage_below_the_minimum_exits_1() -> None:
    result = warden("policy", "test", str(SEMANTICS), "--run", "hide beats", "--min-coverage", "50")
    assert result.exit_code == 1
    assert "coverage 5% is below 50%" in result.output


def test_json_output_is_one_object_per_case_then_a_summary() -> None:
    result = warden("policy", "test", str(SEMANTICS), "--json", "--run", "audit-mode")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    *cases, summary = lines
    assert [c["name"] for c in cases] == [
        "an audit-mode rule records what it would have done without enforcing it",
        "an audit-mode hide rule would have concealed the capability",
    ]
    assert cases[0]["actual"] == {
        "effect": "allow",
        "rule": "lab-readers",
        "message": None,
        "would_have": "deny",
    }
    assert summary["summary"]["passed"] == 2
    assert summary["summary"]["failed"] == 0
    assert "lab-broken-rule" in summary["summary"]["unexercised"]


def test_a_bad_regex_is_a_usage_error() -> None:
    result = warden("policy", "test", str(SEMANTICS), "--run", "(")
    assert result.exit_code == 2
    assert "--run" in result.output and "not a regular expression" in result.output


def test_no_cases_exits_1(tmp_path: Path) -> None:
    folder = copy_semantics(tmp_path)
    shutil.rmtree(folder / "tests")
    result = warden("policy", "test", str(folder))
    assert result.exit_code == 1
    assert "no test cases found" in result.output


def test_broken_policies_exit_1_with_positions(tmp_path: Path) -> None:
    folder = copy_semantics(tmp_path)
    rules = folder / "rules.yaml"
    rules.write_text(rules.read_text().replace("effect: hide\n", "effect: conceal\n", 1))
    result = warden("policy", "test", str(folder))
    assert result.exit_code == 1
    assert f"{folder}/rules.yaml:" in result.output
    assert "rules[4].effect: must be 'allow', 'deny', 'require_approval' or 'hide'" in (
        result.output
    )


def test_check_passes_on_the_examples_and_counts_the_tests() -> None:
    result = warden("policy", "check", str(SEMANTICS))
    assert result.exit_code == 0, result.output
    assert "ok: 9 rules in 1 file, 11 test cases" in result.output


CONDITIONS = """\
rules:
  - id: support-or-small-manager-refunds
    capabilities: ["orders.refund"]
    effect: allow
    when: '"support" in actor.roles || ("manager" in actor.roles && input.amount < 1000)'
"""


def case(name: str, roles: list[str], input: dict[str, object], effect: str) -> str:
    return (
        f"  - name: {name}\n    capability: orders.refund\n"
        f"    actor: {{id: a, roles: {json.dumps(roles)}}}\n"
        f"    input: {json.dumps(input)}\n    expect: {{effect: {effect}}}\n"
    )


def condition_folder(tmp_path: Path, *cases: str) -> Path:
    folder = tmp_path / "policies"
    (folder / "tests").mkdir(parents=True)
    (folder / "rules.yaml").write_text(CONDITIONS)
    (folder / "tests" / "cases.yaml").write_text("tests:\n" + "".join(cases))
    return folder


def test_condition_coverage_needs_each_operand_seen_true_and_false(tmp_path: Path) -> None:
    """Rule coverage alone is 100% here; the operands are not: each of them,
    and the condition, must be seen true and seen false."""
    support = case("support refunds", ["support"], {"amount": 5}, "allow")
    folder = condition_folder(tmp_path, support)
    result = warden("policy", "test", str(folder), "--min-coverage", "100")
    assert result.exit_code == 1
    rules = f"{folder}/rules.yaml:2: support-or-small-manager-refunds"
    assert result.output.splitlines()[1:7] == [
        "condition outcomes no test produced:",
        f"  {rules}: the condition `{CONDITIONS.split(chr(39))[1]}` never false",
        f'  {rules}: operand `"support" in actor.roles` never false',
        f'  {rules}: operand `("manager" in actor.roles && input.amount < 1000)` never true',
        f'  {rules}: operand `"manager" in actor.roles` never true',
        f"  {rules}: operand `input.amount < 1000` never false",
    ]
    assert "coverage 54% (rules 1/1, condition outcomes 5/10)" in result.output
    assert "coverage 54% is below 100%" in result.output

    folder = condition_folder(
        tmp_path / "full",
        support,
        case("a small manager refund", ["manager"], {"amount": 5}, "allow"),
        case("a big manager refund", ["manager"], {"amount": 5000}, "deny"),
    )
    result = warden("policy", "test", str(folder), "--min-coverage", "100")
    assert result.exit_code == 0, result.output
    assert "coverage 100% (rules 1/1, condition outcomes 10/10)" in result.output


def test_a_case_in_which_the_rule_fails_counts_no_condition_outcome(tmp_path: Path) -> None:
    """Without an amount the rule fails for a manager: although its first
    operand was false and the second true, that case counts for nothing."""
    folder = condition_folder(
        tmp_path, case("a manager refund without an amount", ["manager"], {}, "error")
    )
    result = warden("policy", "test", str(folder), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.splitlines()[-1])["summary"]
    assert (summary["exercised"], summary["outcomes_seen"], summary["outcomes"]) == (0, 0, 10)
    assert summary["coverage"] == 0.0
    assert len(summary["unseen_outcomes"]) == 5


LIMITED = """\
rules:
  - {id: allow-all, capabilities: ["orders.*"], effect: allow}
limits:
  - id: per-agent
    capabilities: ["orders.refund"]
    key: actor.id
    rate: 1/min
    burst: 3
  - id: budget
    capabilities: ["orders.refund"]
    key: actor.tenant
    budget: 1000/day
    cost: input.amount
  - id: slots
    capabilities: ["orders.export"]
    concurrency: 2
  - id: big-ones
    capabilities: ["orders.refund"]
    when: input.amount > 5000
    concurrency: 1
"""

LIMITED_CASES = """\
tests:
  - name: the burst spent
    capability: orders.refund
    input: {amount: 1}
    usage: {per-agent: 3}
    expect: {effect: allow, limit: per-agent}
  - name: a token left
    capability: orders.refund
    input: {amount: 1}
    usage: {per-agent: 2, budget: 999}
    expect: {effect: allow}
  - name: over the whole budget
    capability: orders.refund
    input: {amount: 1001}
    expect: {effect: allow, limit: budget}
  - name: both slots taken
    capability: orders.export
    usage: {slots: 2}
    expect: {effect: allow, limit: slots}
"""


def limited_folder(tmp_path: Path, cases: str = LIMITED_CASES) -> Path:
    folder = tmp_path / "policies"
    (folder / "tests").mkdir(parents=True)
    (folder / "rules.yaml").write_text(LIMITED)
    (folder / "tests" / "cases.yaml").write_text(cases)
    return folder


def test_cases_set_prior_usage_and_expect_the_limit_that_refuses(tmp_path: Path) -> None:
    result = warden("policy", "test", str(limited_folder(tmp_path)))
    assert result.exit_code == 0, result.output
    # No case makes big-ones count a call (its `when` never holds).
    assert "limits no test exercised: big-ones" in result.output
    assert "4 passed, 0 failed; coverage 80% (rules 1/1, limits 3/4," in result.output


def test_a_case_a_limit_refuses_fails_unless_it_expects_that_limit(tmp_path: Path) -> None:
    cases = LIMITED_CASES.replace("usage: {per-agent: 2, budget: 999}", "usage: {budget: 1000}")
    result = warden("policy", "test", str(limited_folder(tmp_path, cases)))
    assert result.exit_code == 1
    assert "FAIL  a token left" in result.output
    assert "'limit': 'budget'" in result.output


def test_a_case_naming_an_unknown_limit_is_a_problem_at_its_place(tmp_path: Path) -> None:
    cases = LIMITED_CASES.replace("usage: {slots: 2}", "usage: {slot: 2}")
    result = warden("policy", "test", str(limited_folder(tmp_path, cases)))
    assert result.exit_code == 1
    assert "cases.yaml:18:13: tests[3].usage.slot: no limit has the id 'slot'" in result.output
