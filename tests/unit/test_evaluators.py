"""The fast evaluator against the reference: they must decide alike, and a
set on which they do not is served by the reference."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warden_server.policy.cel import CelPythonEvaluator, EvaluationError
from warden_server.policy.celcpp import CelCppEvaluator
from warden_server.policy.loader import load_policies
from warden_server.policy.serving import fallback_reason, serving
from warden_server.policy.testing import run_policy_tests

RULES = """
rules:
  - id: big-refunds-denied
    capabilities: ["orders.refund"]
    effect: deny
    when: input.amount > 500.5
    message: "Too big."
  - id: refunds-allowed
    capabilities: ["orders.refund"]
    effect: allow
    when: "true"
"""

# The case the two once disagreed on: an integer compared with a double is
# false for the C++ runtime and an error ("no matching overload") for cel-python.
TESTS = """
tests:
  - name: a small refund
    capability: orders.refund
    actor: {id: bot-7, roles: [support], tenant: acme}
    input: {order_id: A1, amount: 120}
    expect: {effect: allow}
"""


def write_set(folder: Path, rules: str = RULES) -> Path:
    (folder / "tests").mkdir(parents=True)
    (folder / "rules.yaml").write_text(rules)
    (folder / "tests" / "cases.yaml").write_text(TESTS)
    return folder


def test_a_case_the_evaluators_decide_differently_fails_the_policy_tests(tmp_path: Path) -> None:
    folder = write_set(tmp_path / "policies")
    policies = load_policies(folder, evaluator=CelCppEvaluator())
    report = run_policy_tests(policies, folder)
    (case,) = report.cases
    assert not case.passed and case.disagreement is not None
    assert case.disagreement.reference["effect"] == "error"
    assert case.disagreement.fast["effect"] == "allow"


def test_a_set_they_disagree_on_is_served_by_the_reference(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = write_set(tmp_path / "policies")
    policies = load_policies(folder, evaluator=CelCppEvaluator())
    reason = fallback_reason(policies, folder)
    assert reason is not None and "disagree" in reason
    with caplog.at_level(logging.WARNING, logger="warden_server.policy.serving"):
        served, failing = serving(policies, folder)
    assert served.evaluator.name == "cel-python" and failing == []
    # The operator is told, with the reason.
    (told,) = [r.getMessage() for r in caplog.records if "cel-python" in r.getMessage()]
    assert told == (
        f"policy revision {policies.revision[:12]} is evaluated by cel-python, "
        f"not cel-cpp: {reason}"
    )


def test_a_set_that_falls_back_is_gated_on_the_references_decisions(tmp_path: Path) -> None:
    """The reference errs on the case (an int against a double), so the case,
    which expects allow, fails under the set that is served."""
    folder = write_set(tmp_path / "policies")
    policies = load_policies(folder, evaluator=CelCppEvaluator())
    served, failing = serving(policies, folder, require_passing_tests=True)
    assert served.evaluator.name == "cel-python"
    (problem,) = failing
    assert "test 'a small refund' fails" in problem.message
    assert "'effect': 'error'" in problem.message


def test_a_set_they_agree_on_is_served_by_the_cpp_runtime(tmp_path: Path) -> None:
    folder = write_set(tmp_path / "policies", RULES.replace("500.5", "500"))
    policies = load_policies(folder, evaluator=CelCppEvaluator())
    assert fallback_reason(policies, folder) is None
    served, failing = serving(policies, folder, require_passing_tests=True)
    assert served.evaluator.name == "cel-cpp" and failing == []
    assert run_policy_tests(policies, folder).ok


def test_a_case_that_fails_under_the_cpp_runtime_gates_the_set(tmp_path: Path) -> None:
    folder = write_set(tmp_path / "policies", RULES.replace("500.5", "100"))
    policies = load_policies(folder, evaluator=CelCppEvaluator())
    served, failing = serving(policies, folder, require_passing_tests=True)
    assert served.evaluator.name == "cel-cpp"
    (problem,) = failing
    assert problem.file.endswith("cases.yaml") and problem.line == 3
    assert "expected {'effect': 'allow'}, got {'effect': 'deny'}" in problem.message
    assert serving(policies, folder) == (served, [])


def test_the_example_policies_are_decided_alike() -> None:
    folder = Path(__file__).resolve().parents[2] / "policies"
    policies = load_policies(folder, evaluator=CelCppEvaluator())
    assert fallback_reason(policies, folder) is None


# Expressions over two ints and a string, from a grammar both runtimes support.
ints = st.recursive(
    st.sampled_from(["x", "y", "0", "1", "-7", "500", "2"]),
    lambda inner: st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%"]), inner).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})"
    ),
    max_leaves=4,
)
strings = st.sampled_from(["s", '"bot-"', '(s + "x")', "string(x)"])
bools = st.recursive(
    st.one_of(
        st.tuples(ints, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), ints).map(
            lambda t: f"{t[0]} {t[1]} {t[2]}"
        ),
        st.tuples(strings, st.sampled_from(["startsWith", "endsWith", "contains"]), strings).map(
            lambda t: f"{t[0]}.{t[1]}({t[2]})"
        ),
        st.tuples(strings, strings).map(lambda t: f"{t[0]} == {t[1]}"),
        st.tuples(ints).map(lambda t: f"{t[0]} in [1, 2, 500]"),
        st.tuples(strings).map(lambda t: f"size({t[0]}) > 3"),
    ),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["&&", "||"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        inner.map(lambda e: f"!({e})"),
    ),
    max_leaves=4,
)


def outcome(evaluator: Any, expression: str, values: dict[str, Any]) -> Any:
    program = evaluator.compile(expression)
    try:
        return program.evaluate(evaluator.activation(values))
    except EvaluationError:
        return "error"


@pytest.mark.heavy
@settings(max_examples=300, deadline=None)
@given(
    expression=bools,
    x=st.integers(-1000, 1000),
    y=st.integers(-1000, 1000),
    s=st.sampled_from(["", "bot-7", "alice", "ünïcode"]),
)
def test_the_evaluators_agree_on_generated_expressions(
    expression: str, x: int, y: int, s: str
) -> None:
    values = {"input": {}, "x": x, "y": y, "s": s}
    fast, reference = CelCppEvaluator(), CelPythonEvaluator()
    fast._env = _env_with(fast, ("x", "y", "s"))
    assert outcome(fast, expression, values) == outcome(reference, expression, values)


def _env_with(evaluator: CelCppEvaluator, names: tuple[str, ...]) -> Any:
    from cel_expr_python import cel

    declared = dict.fromkeys(("input", *names), cel.Type.DYN)
    return cel.NewEnv(variables=declared)


def test_arithmetic_keeps_the_cel_type_of_its_operands() -> None:
    # cel-python once made ``s + "x"`` a plain Python string, without CEL's
    # ``contains``: "no such overload" where the C++ runtime answers true;
    # doubles, lists and bytes lost their CEL type alike. Found by the
    # typed-policies property test; the generated expressions above now call
    # ``contains`` too.
    values = {"input": {}, "x": 0, "y": 0, "s": "bot-7"}
    fast = CelCppEvaluator()
    fast._env = _env_with(fast, ("x", "y", "s"))
    for expression in (
        '(s + "x").contains("7x")',
        'type(s + "x") == string',
        "type(2.5 - 1.0) == double && type(2.5 * 2.0) == double",
        'type([s] + ["x"]) == list && type(b"a" + b"b") == bytes',
    ):
        assert outcome(CelPythonEvaluator(), expression, values) is True, expression
        assert outcome(fast, expression, values) is True, expression


def test_a_known_disagreement_on_error_absorption_is_kept_in_view() -> None:
    # CEL's logical operators absorb an error when the other side decides:
    # cel-python does so for a string added to a bool, the C++ runtime fails
    # the whole expression (no overload of _+_ for string and bool). Found by
    # the generated expressions above; a set with such an expression is served
    # by cel-python (``serving``). Should either runtime change, this test says so.
    expression = '(true || s + "x".startsWith(s))'
    values = {"input": {}, "x": 0, "y": 0, "s": "bot-7"}
    fast = CelCppEvaluator()
    fast._env = _env_with(fast, ("x", "y", "s"))
    assert outcome(fast, expression, values) == "error"
    assert outcome(CelPythonEvaluator(), expression, values) is True


def test_a_set_served_again_is_not_tested_again_until_its_tests_change(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The verdict on a set's cases is kept by what decides it: the same
    files, default effect, evaluator and test files give the same verdict."""
    import warden_server.policy.serving as serving_module

    runs: list[Path] = []
    real = serving_module.run_policy_tests

    def counted(policies: Any, directory: Path, **kw: Any) -> Any:
        runs.append(directory)
        return real(policies, directory, **kw)

    monkeypatch.setattr(serving_module, "run_policy_tests", counted)
    folder = write_set(tmp_path / "policies", RULES.replace("500.5", "500"))

    def served_again(default_effect: str = "deny") -> list[Any]:
        policies = load_policies(folder, evaluator=CelCppEvaluator(), default_effect=default_effect)
        served, failing = serving(policies, folder, require_passing_tests=True)
        assert served.evaluator.name == "cel-cpp"
        return failing

    assert served_again() == [] and served_again() == []
    assert len(runs) == 1
    # A case that now expects deny fails at once: the tests are part of the verdict.
    (folder / "tests" / "cases.yaml").write_text(TESTS.replace("effect: allow", "effect: deny"))
    (problem,) = served_again()
    assert "expected {'effect': 'deny'}, got {'effect': 'allow'}" in problem.message
    assert len(runs) == 2
    # Another default effect is another verdict.
    served_again(default_effect="allow")
    assert len(runs) == 3
