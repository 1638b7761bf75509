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

import contextlib
import functools
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from warden.shared.canonical import NotCanonicalizable, canonical_json
from warden.shared.schema import (
    InvalidSchemaError,
    SchemaValidator,
    compile_validator,
    validation_issues,
)
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
from warden_server.policy.typecheck import number_typing
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
    input_issues: tuple[str, ...] = ()
    """Why the plane refuses the case's input (INPUT_INVALID) before the rules."""

    def to_json(self) -> dict[str, Any]:
        data = {
            "file": self.file,
            "name": self.name,
            "passed": self.passed,
            "expected": self.expected,
            "actual": self.actual,
            "matched": list(self.matched),
            "errors": [{"rule": rule, "error": error} for rule, error in self.errors],
            "input_issues": list(self.input_issues),
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
    input_issues: tuple[str, ...] = ()
    """Why the plane would refuse the case's input, once past the hide rules."""


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
    capabilities: Mapping[str, Registered] | None = None,
) -> tuple[list[LoadedCase], list[Problem]]:
    """Every test case under ``directory/tests``, and every problem with them.

    With ``policies``, a case that expects a rule the set does not have is a
    problem. With ``capabilities`` (``registered_capabilities``), a case
    calls a registered capability as the plane would: named by id, with its
    version, service, side effect and tags; with its input checked against
    the input schema (``LoadedCase.input_issues``: the case fails unless a
    hide rule hides the capability) and typed as the plane types it.
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
            called, issues = _as_registered(case, capabilities)
            cases.append(LoadedCase(name, where, document.position(where), called, issues))
    return cases, problems


@dataclass(frozen=True)
class Registered:
    """A registered capability (its newest version) as test cases call it."""

    capability: TestCapability
    """Its fields, for a case that names it by id."""
    input_schema: Mapping[str, Any]
    """What a case's input must pass, and what types it (``served_input``)."""

    @functools.cached_property
    def _validator(self) -> SchemaValidator:
        return compile_validator(self.input_schema)

    @functools.cached_property
    def _typing(self) -> Callable[[Any], Any] | None:
        return number_typing(self.input_schema)

    def issues(self, value: Any) -> list[dict[str, str]]:
        """Why the plane would refuse ``value`` as this capability's input
        (INPUT_INVALID), each as ``{"path", "message"}``; empty when it would not.

        Raises:
            InvalidSchemaError: the input schema itself is invalid.
        """
        return [issue.to_json() for issue in validation_issues(self._validator, value)]

    def served_input(self, value: Any) -> Any:
        """A valid ``value`` as the plane hands it to policies: read back from
        its canonical JSON (``1.0`` is ``1``), every integer where the schema
        says ``number`` a double (``typecheck.number_typing``)."""
        with contextlib.suppress(NotCanonicalizable):  # not stored, so not typed either
            value = orjson.loads(canonical_json(value))
        return value if self._typing is None else self._typing(value)

    def digest(self) -> str:
        """What of it a case can see, in short (``serving``'s verdicts)."""
        text = self.capability.model_dump_json() + json.dumps(self.input_schema, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def registered_capabilities(records: Iterable[Mapping[str, Any]]) -> dict[str, Registered]:
    """The newest version of each capability, as test cases call it, from
    registry or snapshot records (``id``, ``version``, ``service``,
    ``side_effect``, ``tags``, ``input_schema``) listed oldest first per id.

    Raises:
        ValueError: a record that is no capability (the message says which).
    """
    found: dict[str, Registered] = {}
    for index, record in enumerate(records):
        fields = {k: record[k] for k in CAPABILITY_FIELDS if k in record}
        schema = record.get("input_schema")
        try:
            capability = TestCapability.model_validate(fields)
        except ValidationError as exc:
            (first,) = exc.errors()[:1]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"capabilities[{index}]: {where}: {first['msg']}") from None
        if not isinstance(schema, Mapping):
            raise ValueError(f"capabilities[{index}]: input_schema: must be an object")
        found[capability.id] = Registered(capability, schema)
    return found


def _as_registered(
    case: PolicyTest, capabilities: Mapping[str, Registered] | None
) -> tuple[PolicyTest, tuple[str, ...]]:
    """``case`` calling its capability as registered, if it is: named by id,
    it takes the registered fields; a valid input is typed as the plane types
    it. Also why the plane would refuse the input (INPUT_INVALID), if it would."""
    named = case.capability if isinstance(case.capability, str) else case.capability.id
    registered = capabilities.get(named) if capabilities is not None else None
    if registered is None:
        return case, ()
    update: dict[str, Any] = {}
    if isinstance(case.capability, str):
        update["capability"] = registered.capability
    try:
        found = registered.issues(case.input)
    except InvalidSchemaError as exc:
        return case.model_copy(update=update), (f"its input schema cannot be used: {exc}",)
    if found:
        issues = tuple(f"{i['path'] or '(the input)'}: {i['message']}" for i in found)
        return case.model_copy(update=update), issues
    update["input"] = registered.served_input(case.input)
    return case.model_copy(update=update), ()


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
    capabilities: Mapping[str, Registered] | None = None,
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
    capabilities: Mapping[str, Registered] | None = None,
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
    if item.input_issues:
        hidden = policies.visibility(capability_id, without_input)
        if hidden.effect != "hide":
            return _refused_input(policies, item, hidden, without_input, report)
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


def _refused_input(
    policies: PolicySet,
    item: LoadedCase,
    hidden: Decision,
    without_input: Activation,
    report: TestReport,
) -> CaseResult:
    """A case whose input the plane refuses once the hide rules let the call
    through: no other rule runs (SI-2), and the case fails, saying why."""
    report.exercised.update(r.rule_id for r in hidden.results if r.matched and not r.error)
    for r in hidden.results:
        report.conditions.record(r, without_input)
    return CaseResult(
        file=f"{item.file}:{item.position.line}",
        name=item.case.name,
        passed=False,
        expected=item.case.expect.model_dump(exclude_none=True),
        actual={"effect": "invalid", "rule": None, "message": None, "would_have": "invalid"},
        matched=tuple(r.rule_id for r in hidden.results if r.matched),
        errors=tuple((r.rule_id, r.error) for r in hidden.results if r.error),
        input_issues=item.input_issues,
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
        why = "; ".join(
            [f"rule {rule!r}: {error}" for rule, error in case.errors]
            + [f"the plane refuses its input (INPUT_INVALID): {i}" for i in case.input_issues]
        )
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
