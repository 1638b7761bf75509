"""The policy test runner: the SPEC §6 test files, with coverage.

A rule counts as exercised when at least one test case makes it match,
whether it is enforced or in audit mode; a rule that fails to evaluate is
not exercised by that case. Coverage also counts the outcomes of every
condition: the condition and each ``&&``/``||`` operand seen true and seen
false (``policy/coverage.py``). The figure ``--min-coverage`` applies to
is the combined one: rules exercised plus outcomes seen, over rules plus
outcomes.

A set served by a faster evaluator runs every case on it and on the reference
(cel-python) too, and a case they decide differently fails: SPEC §6 lets a
faster evaluator serve only a set on which it agrees with the reference on
every policy test. Agreement is judged on what a decision is made of — the
effect, the deciding rule, the message, and for every rule evaluated whether
it matched or failed — not on the wording of error messages.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from warden_server.limits import epoch, judge, prior_usage, strongest
from warden_server.policy import yamlpos
from warden_server.policy.cel import Activation
from warden_server.policy.coverage import ConditionCoverage
from warden_server.policy.engine import Decision, LimitCall, PolicySet, would_have
from warden_server.policy.loader import POLICY_SUFFIXES, Problem, dotted, validation_problems
from warden_server.policy.model import (
    PolicyTest,
    PolicyTestFile,
    TestCapability,
    parse_timestamp,
)
from warden_server.policy.variables import CAPABILITY_FIELDS, decision_variables


@dataclass(frozen=True, slots=True)
class CaseResult:
    file: str
    name: str
    passed: bool
    expected: dict[str, Any]
    actual: dict[str, Any]
    disagreement: Disagreement | None = None
    """How the evaluators decided the case differently, when they did."""
    matched: tuple[str, ...] = ()
    """The rules whose conditions held, in load order."""
    errors: tuple[tuple[str, str], ...] = ()
    """(rule id, why it failed to evaluate), in words."""

    def to_json(self) -> dict[str, Any]:
        data = {
            "file": self.file,
            "name": self.name,
            "passed": self.passed,
            "expected": self.expected,
            "actual": self.actual,
            "matched": list(self.matched),
            "errors": [{"rule": rule, "error": error} for rule, error in self.errors],
        }
        if self.disagreement is not None:
            data["disagreement"] = self.disagreement.to_json()
        return data


@dataclass(frozen=True, slots=True)
class Disagreement:
    """One test case the served evaluator and the reference decide differently."""

    where: str
    """``file:line`` of the case."""
    name: str
    reference_name: str
    reference: dict[str, Any]
    fast_name: str
    fast: dict[str, Any]

    def __str__(self) -> str:
        return (
            f"{self.where}: {self.name}: the evaluators disagree: "
            f"{self.reference_name} gives {self.reference}, {self.fast_name} gives {self.fast}"
        )

    def to_json(self) -> dict[str, Any]:
        return {self.reference_name: self.reference, self.fast_name: self.fast}


@dataclass(slots=True)
class TestReport:
    cases: list[CaseResult] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)
    exercised: set[str] = field(default_factory=set)
    """The rules some case made match, and the limits some case made count a call."""
    conditions: ConditionCoverage = field(default_factory=ConditionCoverage)
    unregistered: list[str] = field(default_factory=list)
    """The capability ids cases name that are not among the registered
    capabilities given: their cases call them with ``TestCapability``'s defaults."""

    @property
    def failed(self) -> list[CaseResult]:
        return [c for c in self.cases if not c.passed]

    @property
    def unexercised(self) -> list[str]:
        return [r for r in self.rules if r not in self.exercised]

    @property
    def uncounted(self) -> list[str]:
        """The limits no case made count a call."""
        return [limit for limit in self.limits if limit not in self.exercised]

    @property
    def rule_coverage(self) -> float:
        """The share of rules some case made match (1.0 without rules); a rule
        that failed to evaluate is not covered."""
        return 1.0 if not self.rules else len(set(self.rules) & self.exercised) / len(self.rules)

    @property
    def coverage(self) -> float:
        """Rules exercised and condition outcomes seen, over rules and outcomes
        (1.0 when there are neither): what ``--min-coverage`` applies to."""
        total = len(self.rules) + len(self.limits) + self.conditions.outcomes
        covered = len(set(self.rules + self.limits) & self.exercised)
        covered += self.conditions.outcomes_seen
        return 1.0 if not total else covered / total

    @property
    def ok(self) -> bool:
        return not self.failed and not self.problems and bool(self.cases)

    def summary_json(self) -> dict[str, Any]:
        return {
            "passed": len(self.cases) - len(self.failed),
            "failed": len(self.failed),
            "rules": len(self.rules),
            "exercised": len(set(self.rules) & self.exercised),
            "outcomes": self.conditions.outcomes,
            "outcomes_seen": self.conditions.outcomes_seen,
            "coverage": round(self.coverage * 100, 2),
            "rule_coverage": round(self.rule_coverage * 100, 2),
            "unexercised": self.unexercised,
            "limits": len(self.limits),
            "limits_exercised": len(set(self.limits) & self.exercised),
            "uncounted_limits": self.uncounted,
            "unseen_outcomes": self.conditions.unseen(),
            "problems": [p.to_json() for p in sorted(self.problems)],
            "unregistered_capabilities": self.unregistered,
        }


@dataclass(frozen=True, slots=True)
class LoadedCase:
    file: str
    path: yamlpos.Path
    """Where the case stands in its file, e.g. ("tests", 3)."""
    position: yamlpos.Position
    case: PolicyTest


def test_files(directory: Path) -> list[Path]:
    """The test files of a policy folder: ``DIR/tests/*.yaml``."""
    folder = directory / "tests"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix in POLICY_SUFFIXES and p.is_file())


def tests_digest(directory: Path) -> str:
    """What the folder's test files are: SHA-256 over their names and contents."""
    digest = hashlib.sha256()
    for path in test_files(directory):
        try:
            content = path.read_bytes()
        except OSError:
            content = b""
        digest.update(f"{path.name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def load_test_cases(
    directory: str | Path,
    policies: PolicySet | None = None,
    capabilities: Mapping[str, TestCapability] | None = None,
) -> tuple[list[LoadedCase], list[Problem]]:
    """Every test case under ``directory/tests``, and every problem with them.

    With ``policies``, a case that expects a rule the set does not have is a
    problem. With ``capabilities`` (``registered_capabilities``), a case that
    names a registered capability by its id calls it as registered: its
    version, service, side effect and tags, as the plane would see them.
    """
    cases: list[LoadedCase] = []
    problems: list[Problem] = []
    rule_ids = {r.id for r in policies.rules} if policies is not None else None
    limit_ids = {limit.id for limit in policies.limits} if policies is not None else None
    for path in test_files(Path(directory)):
        name = str(path)
        try:
            document = yamlpos.load(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, yamlpos.YAMLSyntaxError) as exc:
            at = getattr(exc, "position", yamlpos.Position(1, 1))
            problems.append(Problem(name, at.line, at.column, "", str(exc)))
            continue
        for where, case in _valid_cases(name, document, problems):
            rule = case.expect.rule
            if rule_ids is not None and rule is not None and rule not in rule_ids:
                at = document.position((*where, "expect", "rule"))
                problems.append(
                    Problem(
                        name,
                        at.line,
                        at.column,
                        dotted((*where, "expect", "rule")),
                        f"no rule has the id {rule!r}",
                    )
                )
            if limit_ids is not None:
                named = [(("expect", "limit"), case.expect.limit)]
                named += [(("usage", limit_id), limit_id) for limit_id in case.usage]
                for inner, limit_id in named:
                    if limit_id is not None and limit_id not in limit_ids:
                        at = document.key_position((*where, *inner))
                        problems.append(
                            Problem(
                                name,
                                at.line,
                                at.column,
                                dotted((*where, *inner)),
                                f"no limit has the id {limit_id!r}",
                            )
                        )
            registered = (
                capabilities.get(case.capability)
                if isinstance(case.capability, str) and capabilities is not None
                else None
            )
            called = (
                case if registered is None else case.model_copy(update={"capability": registered})
            )
            cases.append(LoadedCase(name, where, document.position(where), called))
    return cases, problems


def registered_capabilities(records: Iterable[Mapping[str, Any]]) -> dict[str, TestCapability]:
    """The newest version of each capability, as a test case naming it by id
    calls it, from registry or snapshot records (``id``, ``version``,
    ``service``, ``side_effect``, ``tags``) listed oldest first per id.

    Raises:
        ValueError: a record that is no capability (the message says which).
    """
    found: dict[str, TestCapability] = {}
    for index, record in enumerate(records):
        fields = {k: record[k] for k in CAPABILITY_FIELDS if k in record}
        try:
            capability = TestCapability.model_validate(fields)
        except ValidationError as exc:
            (first,) = exc.errors()[:1]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"capabilities[{index}]: {where}: {first['msg']}") from None
        found[capability.id] = capability
    return found


def _valid_cases(
    file: str, document: yamlpos.Document, problems: list[Problem]
) -> list[tuple[yamlpos.Path, PolicyTest]]:
    """The cases that validate, each with its place; problems for the others."""
    data = document.data if document.data is not None else {}
    try:
        parsed = PolicyTestFile.model_validate(data)
    except ValidationError as exc:
        problems.extend(validation_problems(file, document, exc, model=PolicyTestFile))
        raw_cases = data.get("tests") if isinstance(data, dict) else None
        if not isinstance(raw_cases, list):
            return []
        broken = {e["loc"][1] for e in exc.errors() if e["loc"][:1] == ("tests",)}
        return [
            (("tests", i), PolicyTest.model_validate(raw))
            for i, raw in enumerate(raw_cases)
            if i not in broken
        ]
    return [(("tests", i), case) for i, case in enumerate(parsed.tests)]


def run_policy_tests(
    policies: PolicySet,
    directory: str | Path,
    *,
    pattern: re.Pattern[str] | None = None,
    now: datetime | None = None,
    conditions: bool = True,
    capabilities: Mapping[str, TestCapability] | None = None,
) -> TestReport:
    """Run every test case under ``directory/tests`` against ``policies``.

    Args:
        policies: The compiled set.
        directory: The policy folder; its ``tests/`` holds the cases.
        pattern: Run only the cases whose name it matches (``re.search``).
        now: ``now`` for cases that give none (default: the run's start).
        conditions: Count condition outcomes too (which evaluates every
            ``&&``/``||`` operand of every rule a case evaluates).
        capabilities: The registered capabilities (``registered_capabilities``):
            a case naming one by id calls it as registered. Without them, or
            for an id not among them, its fields take ``TestCapability``'s
            defaults.
    """
    started = now or datetime.now(UTC)
    loaded, problems = load_test_cases(directory, policies, capabilities)
    report = TestReport(
        problems=problems,
        rules=[r.id for r in policies.rules],
        limits=[limit.id for limit in policies.limits],
    )
    if conditions:
        report.conditions = ConditionCoverage.of(policies)
    unregistered = set()
    for item in loaded:
        if pattern and not pattern.search(item.case.name):
            continue
        if isinstance(item.case.capability, str):  # not found among the registered
            unregistered.add(item.case.capability)
        report.cases.append(_run_case(policies, item, started, report))
    report.unregistered = sorted(unregistered)
    return report


def disagreements(
    policies: PolicySet,
    directory: str | Path,
    now: datetime | None = None,
    capabilities: Mapping[str, TestCapability] | None = None,
) -> list[Disagreement]:
    """Every case under ``directory/tests`` on which ``policies`` and its
    reference twin decide differently (none when it is the reference)."""
    if policies.reference() is policies:
        return []
    cases, _ = load_test_cases(directory, policies, capabilities)
    started = now or datetime.now(UTC)
    found = []
    for item in cases:
        served = evaluate_case(policies, item.case, started)
        disagreement = _compare(policies, item, started, served)
        if disagreement is not None:
            found.append(disagreement)
    return found


def agreement_outcome(hidden: Decision, decision: Decision | None) -> dict[str, Any]:
    """What the evaluators must agree on, for one case's decisions."""
    final = decision or hidden
    evaluated = [r for d in (hidden, decision) if d is not None for r in d.results]
    return {
        "effect": final.effect,
        "rule": final.rule_id,
        "message": final.message,
        "would_have": (would_have(hidden, decision) or final).effect,
        "rules": {
            r.rule_id: "error" if r.error else ("matched" if r.matched else "not matched")
            for r in evaluated
        },
        "message_fell_back": sorted(r.rule_id for r in evaluated if r.message_error),
    }


def _compare(
    policies: PolicySet,
    item: LoadedCase,
    now: datetime,
    served: tuple[Decision, Decision | None],
) -> Disagreement | None:
    reference = policies.reference()
    if reference is policies:
        return None
    expected = agreement_outcome(*evaluate_case(reference, item.case, now))
    got = agreement_outcome(*served)
    if expected == got:
        return None
    return Disagreement(
        where=f"{item.file}:{item.position.line}",
        name=item.case.name,
        reference_name=reference.evaluator.name,
        reference=expected,
        fast_name=policies.evaluator.name,
        fast=got,
    )


def case_activations(
    policies: PolicySet, case: PolicyTest, now: datetime
) -> tuple[str, Activation, Activation]:
    """The capability id of a case, and its variables without and with ``input``."""
    capability = (
        case.capability
        if isinstance(case.capability, TestCapability)
        else TestCapability(id=case.capability)
    )
    context = dict(case.context)
    surface = str(context.pop("surface", "direct"))
    activation = policies.activation(
        decision_variables(
            actor=case.actor.model_dump(),
            capability=capability.model_dump(),
            context=context,
            surface=surface,
            now=parse_timestamp(case.now) if case.now else now,
        )
    )
    return capability.id, activation, policies.activation({"input": case.input}, activation)


def evaluate_case(
    policies: PolicySet, case: PolicyTest, now: datetime
) -> tuple[Decision, Decision | None]:
    """The visibility decision and, unless hidden, the policy decision."""
    capability_id, without_input, with_input = case_activations(policies, case, now)
    return decide_case(policies, capability_id, without_input, with_input)


def decide_case(
    policies: PolicySet, capability_id: str, without_input: Activation, with_input: Activation
) -> tuple[Decision, Decision | None]:
    """Step 4 with the variables without ``input``, then, unless hidden, step 7."""
    hidden = policies.visibility(capability_id, without_input)
    if hidden.effect == "hide":
        return hidden, None
    return hidden, policies.decide(capability_id, with_input)


def _run_case(
    policies: PolicySet, item: LoadedCase, now: datetime, report: TestReport
) -> CaseResult:
    capability_id, without_input, with_input = case_activations(policies, item.case, now)
    hidden, decision = decide_case(policies, capability_id, without_input, with_input)
    disagreement = _compare(policies, item, now, (hidden, decision))
    final = decision or hidden
    for d, activation in ((hidden, without_input), (decision, with_input)):
        if d is not None:
            report.exercised.update(r.rule_id for r in d.results if r.matched and not r.error)
            for r in d.results:
                report.conditions.record(r, activation)
    actual: dict[str, Any] = {
        "effect": final.effect,
        "rule": final.rule_id,
        "message": final.message,
        "would_have": (would_have(hidden, decision) or final).effect,
    }
    limit_errors: list[tuple[str, str]] = []
    if final.effect in ("allow", "require_approval"):
        counted = policies.count(capability_id, with_input)
        report.exercised.update(call.limit.id for call in counted.calls)
        limit_errors = list(counted.errors)
        moment = epoch(parse_timestamp(item.case.now) if item.case.now else now)
        enforced = {limit.id for limit in policies.limits if limit.enforced}
        if any(limit_id in enforced for limit_id, _ in limit_errors):
            actual["effect"] = "error"  # the plane fails closed: POLICY_FAILED
        elif (limited := _limited_by(counted.calls, item.case.usage, moment)) is not None:
            actual["limit"] = limited
    expected = item.case.expect.model_dump(exclude_none=True)
    # A call a limit refuses fails a case that does not expect that limit.
    passed = (
        disagreement is None
        and all(actual.get(key) == value for key, value in expected.items())
        and expected.get("limit") == actual.get("limit")
    )
    where = f"{item.file}:{item.position.line}"
    results = [r for d in (hidden, decision) if d is not None for r in d.results]
    return CaseResult(
        file=where,
        name=item.case.name,
        passed=passed,
        expected=expected,
        actual=actual,
        disagreement=disagreement,
        matched=tuple(r.rule_id for r in results if r.matched),
        errors=tuple((r.rule_id, r.error) for r in results if r.error) + tuple(limit_errors),
    )


def _limited_by(calls: Sequence[LimitCall], usage: Mapping[str, float], now: float) -> str | None:
    """The limit that refuses a call, given the prior usage of its key."""
    refusals = []
    for call in calls:
        if not call.limit.enforced:
            continue
        refusal = judge(call, prior_usage(call.limit, usage.get(call.limit.id, 0.0), now), now)
        if refusal is not None:
            refusals.append(refusal)
    return strongest(refusals).limit_id if refusals else None


def failing_tests(report: TestReport) -> list[Problem]:
    """The cases a run failed, and the problems of its test files, as
    problems: a set with any of them is not loaded."""
    problems = list(report.problems)
    for case in report.failed:
        file, _, line = case.file.rpartition(":")
        shown = {k: case.actual.get(k) for k in case.expected}
        if "limit" in case.actual:  # a refusal the case did not expect
            shown["limit"] = case.actual["limit"]
        why = "; ".join(f"rule {rule!r}: {error}" for rule, error in case.errors)
        problems.append(
            Problem(
                file,
                int(line),
                1,
                "",
                f"test {case.name!r} fails: expected {case.expected}, got {shown}"
                + (f" ({why})" if why else ""),
            )
        )
    return problems
