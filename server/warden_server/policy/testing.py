"""The policy test runner: the SPEC §6 test files, with rule coverage."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from warden_server.policy import yamlpos
from warden_server.policy.engine import Decision, PolicySet
from warden_server.policy.loader import POLICY_SUFFIXES, Problem
from warden_server.policy.model import PolicyTest, PolicyTestFile, TestCapability


@dataclass(frozen=True, slots=True)
class CaseResult:
    file: str
    name: str
    passed: bool
    expected: dict[str, Any]
    actual: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "name": self.name,
            "passed": self.passed,
            "expected": self.expected,
            "actual": self.actual,
        }


@dataclass(slots=True)
class TestReport:
    cases: list[CaseResult] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    exercised: set[str] = field(default_factory=set)

    @property
    def failed(self) -> list[CaseResult]:
        return [c for c in self.cases if not c.passed]

    @property
    def unexercised(self) -> list[str]:
        return [r for r in self.rules if r not in self.exercised]

    @property
    def coverage(self) -> float:
        return 1.0 if not self.rules else len(set(self.rules) & self.exercised) / len(self.rules)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.problems and bool(self.cases)


def test_files(directory: Path) -> list[Path]:
    folder = directory / "tests"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in POLICY_SUFFIXES and p.is_file())


def run_policy_tests(
    policies: PolicySet, directory: str | Path, *, pattern: str | None = None
) -> TestReport:
    """Run every test case under ``directory/tests`` against ``policies``."""
    directory = Path(directory)
    selector = re.compile(pattern) if pattern else None
    report = TestReport(rules=[r.id for r in policies.rules])
    for path in test_files(directory):
        for case in _load_cases(path, report.problems):
            if selector and not selector.search(case.name):
                continue
            report.cases.append(_run_case(policies, str(path), case, report.exercised))
    return report


def _load_cases(path: Path, problems: list[Problem]) -> list[PolicyTest]:
    try:
        document = yamlpos.load(path.read_text(encoding="utf-8"))
    except yamlpos.YAMLSyntaxError as exc:
        problems.append(Problem(str(path), exc.position.line, exc.position.column, "", str(exc)))
        return []
    try:
        return PolicyTestFile.model_validate(document.data or {}).tests
    except ValidationError as exc:
        for error in exc.errors():
            loc = tuple(error["loc"])
            position = document.position(loc)
            problems.append(
                Problem(
                    str(path),
                    position.line,
                    position.column,
                    ".".join(str(p) for p in loc),
                    str(error["msg"]),
                )
            )
        return []


def evaluate_case(policies: PolicySet, case: PolicyTest) -> tuple[Decision, Decision | None]:
    """The visibility decision and, unless hidden, the policy decision."""
    capability = (
        case.capability
        if isinstance(case.capability, TestCapability)
        else TestCapability(id=case.capability)
    )
    now = datetime.fromisoformat(case.now.replace("Z", "+00:00")) if case.now else datetime.now(UTC)
    variables: dict[str, Any] = {
        "actor": case.actor.model_dump(),
        "capability": capability.model_dump(),
        "context": {"surface": "direct", **case.context},
        "now": now,
    }
    hidden = policies.visibility(capability.id, policies.activation(variables))
    if hidden.effect == "hide":
        return hidden, None
    variables["input"] = case.input
    return hidden, policies.decide(capability.id, policies.activation(variables))


def _run_case(policies: PolicySet, file: str, case: PolicyTest, exercised: set[str]) -> CaseResult:
    hidden, decision = evaluate_case(policies, case)
    final = decision or hidden
    for d in (hidden, decision):
        if d is not None:
            exercised.update(r.rule_id for r in d.results if r.matched)
    actual: dict[str, Any] = {
        "effect": final.effect,
        "rule": final.rule_id,
        "message": final.message,
    }
    expected = case.expect.model_dump(exclude_none=True)
    passed = all(actual.get(key) == value for key, value in expected.items())
    return CaseResult(file=file, name=case.name, passed=passed, expected=expected, actual=actual)
