"""A compiled policy set and the decisions it makes.

Compiled once per revision; a decision builds its activation once and
evaluates only the rules whose globs match its capability (``GlobIndex``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from warden_server.policy.cel import (
    Activation,
    EvaluationError,
    Evaluator,
    Program,
    error_in_words,
)
from warden_server.policy.globs import GlobIndex, matches
from warden_server.policy.model import EFFECT_PRECEDENCE, Effect, Limit, Outcome, Rule, parse_per


@dataclass(frozen=True, slots=True)
class CompiledRule:
    rule: Rule
    file: str
    line: int
    when: Program
    message_expr: Program | None
    approvers: Program | None
    ttl_seconds: int | None
    texts: Mapping[str, str] = field(default_factory=dict)
    """The text each expression key was compiled from, where it differs from
    the rule's (a file's variables and constants written out)."""

    @property
    def id(self) -> str:
        return self.rule.id

    def text(self, key: str) -> str | None:
        """The expression ``key`` (when, message_expr, approvers) as compiled."""
        if key in self.texts:
            return self.texts[key]
        written: str | None = getattr(self.rule, key)
        return "true" if key == "approvers" and written is None and self.approvers else written

    @property
    def enforced(self) -> bool:
        return self.rule.mode == "enforce"

    def with_reference_programs(self) -> CompiledRule:
        """This rule with every expression compiled by the reference evaluator."""
        return replace(
            self,
            when=self.when.reference,
            message_expr=self.message_expr.reference if self.message_expr else None,
            approvers=self.approvers.reference if self.approvers else None,
        )

    def applies_to(self, capability_id: str) -> bool:
        return any(matches(capability_id, glob) for glob in self.rule.capabilities)


@dataclass(frozen=True, slots=True)
class CompiledLimit:
    """A limit as compiled: its expressions, and its numbers in seconds."""

    limit: Limit
    file: str
    line: int
    when: Program
    key: Program | None
    cost: Program | None
    texts: Mapping[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.limit.id

    @property
    def kind(self) -> str:
        return self.limit.kind

    @property
    def enforced(self) -> bool:
        return self.limit.mode == "enforce"

    @property
    def capacity(self) -> float:
        """The bucket's size (rate), the budget, or the cap (concurrency)."""
        limit = self.limit
        if limit.rate is not None:
            return float(limit.burst or parse_per(limit.rate, whole=True)[0])
        if limit.budget is not None:
            return parse_per(limit.budget, whole=False)[0]
        assert limit.concurrency is not None
        return float(limit.concurrency)

    @property
    def period_seconds(self) -> float:
        """rate: seconds per token; budget: the window; concurrency: 0."""
        limit = self.limit
        if limit.rate is not None:
            count, seconds = parse_per(limit.rate, whole=True)
            return seconds / count
        if limit.budget is not None:
            return float(parse_per(limit.budget, whole=False)[1])
        return 0.0

    def text(self, key: str) -> str | None:
        if key in self.texts:
            return self.texts[key]
        written: str | None = getattr(self.limit, key)
        return written

    def with_reference_programs(self) -> CompiledLimit:
        return replace(
            self,
            when=self.when.reference,
            key=self.key.reference if self.key else None,
            cost=self.cost.reference if self.cost else None,
        )


@dataclass(frozen=True, slots=True)
class LimitCall:
    """What one call counts against one limit: the key and the cost."""

    limit: CompiledLimit
    key: str
    cost: float


@dataclass(frozen=True, slots=True)
class LimitsOutcome:
    """The limits that count a call, or the ones that failed to evaluate."""

    calls: tuple[LimitCall, ...] = ()
    errors: tuple[tuple[str, str], ...] = ()
    """(limit id, why), for enforced and audit limits alike."""
    skipped: tuple[str, ...] = ()
    """The limits matched by capability whose ``when`` did not hold."""


@dataclass(frozen=True, slots=True)
class RuleResult:
    """How one rule evaluated in one decision (recorded in the audit log)."""

    rule_id: str
    effect: Effect
    mode: str
    matched: bool
    error: str | None = None
    message_error: str | None = None
    """Why ``message_expr`` failed, when the message fell back to ``message``."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.rule_id,
            "effect": self.effect,
            "mode": self.mode,
            "matched": self.matched,
        }
        if self.error:
            data["error"] = self.error
        if self.message_error:
            data["message_error"] = self.message_error
        return data


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of evaluating a policy set for one request."""

    effect: Outcome
    revision: str
    rule: CompiledRule | None = None
    message: str | None = None
    results: tuple[RuleResult, ...] = ()
    would_have: Decision | None = None
    """What audit-mode rules would have decided had they been enforced, when
    that differs from this decision ("would have denied")."""

    @property
    def rule_id(self) -> str | None:
        return self.rule.id if self.rule else None

    def rules_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.results]

    def outcome_json(self) -> dict[str, Any]:
        """The effect, the deciding rule and the message, for the audit log."""
        return {"effect": self.effect, "rule": self.rule_id, "message": self.message}


@dataclass(frozen=True, slots=True)
class _RulesFor:
    hide: tuple[CompiledRule, ...]
    decide: tuple[CompiledRule, ...]


@dataclass(slots=True)
class PolicySet:
    """A whole, compiled policy set: swapped atomically, never edited (SI-12)."""

    revision: str
    rules: tuple[CompiledRule, ...]
    files: tuple[str, ...]
    evaluator: Evaluator
    default_effect: Literal["allow", "deny"] = "deny"
    limits: tuple[CompiledLimit, ...] = ()
    _index: GlobIndex = field(init=False, repr=False)
    _limit_index: GlobIndex = field(init=False, repr=False)
    _for: dict[str, _RulesFor] = field(init=False, repr=False, default_factory=dict)
    """The rules of each capability asked about, split by kind, found once."""

    def __post_init__(self) -> None:
        self._index = GlobIndex(r.rule.capabilities for r in self.rules)
        self._limit_index = GlobIndex(limit.limit.capabilities for limit in self.limits)

    def reference(self) -> PolicySet:
        """The same set evaluated by the reference evaluator (itself when it is)."""
        if self.evaluator.reference is self.evaluator:
            return self
        return PolicySet(
            revision=self.revision,
            rules=tuple(rule.with_reference_programs() for rule in self.rules),
            files=self.files,
            evaluator=self.evaluator.reference,
            default_effect=self.default_effect,
            limits=tuple(limit.with_reference_programs() for limit in self.limits),
        )

    def limits_for(self, capability_id: str) -> tuple[CompiledLimit, ...]:
        """The limits whose globs match the capability, in load order."""
        return tuple(self.limits[p] for p in self._limit_index.positions(capability_id))

    def limit(self, limit_id: str) -> CompiledLimit | None:
        return next((limit for limit in self.limits if limit.id == limit_id), None)

    def count(self, capability_id: str, activation: Activation) -> LimitsOutcome:
        """What a call counts against each limit that matches it: its key and
        cost, where ``when`` holds. A limit that fails to evaluate is an error
        (the caller fails closed for an enforced one)."""
        calls: list[LimitCall] = []
        errors: list[tuple[str, str]] = []
        skipped: list[str] = []
        for limit in self.limits_for(capability_id):
            try:
                counted = _count(limit, activation)
            except _LimitBroke as exc:
                errors.append((limit.id, str(exc)))
                continue
            if counted is None:
                skipped.append(limit.id)
            else:
                calls.append(counted)
        return LimitsOutcome(tuple(calls), tuple(errors), tuple(skipped))

    def rules_for(self, capability_id: str) -> tuple[CompiledRule, ...]:
        """The rules whose globs match the capability, in load order."""
        return tuple(self.rules[p] for p in self._index.positions(capability_id))

    def _rules_of(self, capability_id: str) -> _RulesFor:
        found = self._for.get(capability_id)
        if found is None:
            rules = self.rules_for(capability_id)
            found = _RulesFor(
                hide=tuple(r for r in rules if r.rule.effect == "hide"),
                decide=tuple(r for r in rules if r.rule.effect != "hide"),
            )
            # Only registered ids get this far (an unknown id fails at resolve),
            # so the cache is bounded by the registry.
            self._for[capability_id] = found
        return found

    def activation(
        self, variables: Mapping[str, Any], base: Activation | None = None
    ) -> Activation:
        """Convert a decision's variables once (see ``variables.decision_variables``);
        with ``base``, add ``variables`` to it."""
        return self.evaluator.activation(variables, base)

    def visibility(self, capability_id: str, activation: Activation) -> Decision:
        """Step 4: ``hide`` if an enforced hide rule matches, else ``allow``.

        A hide rule that fails to evaluate conceals too: revealing that a
        capability exists is itself a disclosure.
        """
        hides = self._rules_of(capability_id).hide
        results = tuple(_evaluate(rule, activation) for rule in hides)
        enforced = _hide_outcome(hides, results, enforced_only=True)
        decision = Decision(enforced[0], self.revision, enforced[1], None, results)
        shadow = _hide_outcome(hides, results, enforced_only=False)
        if shadow != enforced:
            decision = _with_shadow(decision, Decision(shadow[0], self.revision, shadow[1]))
        return decision

    def decide(self, capability_id: str, activation: Activation) -> Decision:
        """Step 7: every non-hide rule for the capability, by precedence.

        deny beats require_approval beats allow; with no match the default
        applies; an enforced rule that fails to evaluate fails closed
        (``error``). Audit-mode rules are evaluated alongside and only
        recorded, in ``would_have``.
        """
        rules = self._rules_of(capability_id).decide
        results = [_evaluate(rule, activation) for rule in rules]
        decision = self._decision(rules, results, activation, enforced_only=True)
        if any(not r.enforced for r in rules):
            shadow = self._decision(rules, results, activation, enforced_only=False)
            if (shadow.effect, shadow.rule_id) != (decision.effect, decision.rule_id):
                decision = _with_shadow(decision, shadow)
        return decision

    def _decision(
        self,
        rules: Sequence[CompiledRule],
        results: list[RuleResult],
        activation: Activation,
        *,
        enforced_only: bool,
    ) -> Decision:
        considered = [
            (rule, result)
            for rule, result in zip(rules, results, strict=True)
            if rule.enforced or not enforced_only
        ]
        if any(result.error is not None for _, result in considered):
            return Decision("error", self.revision, None, None, tuple(results))
        matched: dict[str, CompiledRule] = {}
        for rule, result in considered:
            if result.matched:
                matched.setdefault(rule.rule.effect, rule)
        for effect in EFFECT_PRECEDENCE:
            if effect in matched:
                rule = matched[effect]
                message, problem = _message(rule, activation)
                if problem is not None:
                    results = [
                        _replace_message_error(r, problem) if r.rule_id == rule.id else r
                        for r in results
                    ]
                return Decision(effect, self.revision, rule, message, tuple(results))
        return Decision(self.default_effect, self.revision, None, None, tuple(results))


def would_have(visibility: Decision, decision: Decision | None) -> Decision | None:
    """What a request's decisions would have been had audit-mode rules been
    enforced, or None when that changes nothing. An audit hide rule would
    have concealed the capability before any other rule ran."""
    shadow = visibility.would_have
    if shadow is not None and shadow.effect == "hide":
        return shadow
    return decision.would_have if decision is not None else None


def _hide_outcome(
    rules: Sequence[CompiledRule], results: Iterable[RuleResult], *, enforced_only: bool
) -> tuple[Outcome, CompiledRule | None]:
    failed = False
    for rule, result in zip(rules, results, strict=True):
        if enforced_only and not rule.enforced:
            continue
        if result.matched:
            return "hide", rule
        failed = failed or result.error is not None
    return ("hide", None) if failed else ("allow", None)


def _with_shadow(decision: Decision, shadow: Decision) -> Decision:
    return Decision(
        decision.effect,
        decision.revision,
        decision.rule,
        decision.message,
        decision.results,
        would_have=shadow,
    )


def _replace_message_error(result: RuleResult, problem: str) -> RuleResult:
    return RuleResult(
        result.rule_id, result.effect, result.mode, result.matched, result.error, problem
    )


def _evaluate(rule: CompiledRule, activation: Activation) -> RuleResult:
    try:
        value = rule.when.evaluate(activation)
    except EvaluationError as exc:
        error = error_in_words(str(exc), rule.rule.when)
        return RuleResult(rule.id, rule.rule.effect, rule.rule.mode, False, error)
    if not isinstance(value, bool):
        return RuleResult(
            rule.id,
            rule.rule.effect,
            rule.rule.mode,
            False,
            f"'when' must be a bool, got {type(value).__name__}",
        )
    return RuleResult(rule.id, rule.rule.effect, rule.rule.mode, value)


def _message(rule: CompiledRule, activation: Activation) -> tuple[str | None, str | None]:
    """The rule's message, and why ``message_expr`` failed when it fell back."""
    if rule.message_expr is None:
        return rule.rule.message, None
    try:
        value = rule.message_expr.evaluate(activation)
    except EvaluationError as exc:
        return rule.rule.message, error_in_words(str(exc), rule.rule.message_expr or "")
    if not isinstance(value, str) or not value:
        # The type only: the value may be input, and the audit log keeps no raw input.
        return (
            rule.rule.message,
            f"'message_expr' must give a non-empty string, got {type(value).__name__}",
        )
    return value, None


class _LimitBroke(Exception):
    """A limit's expression failed, or gave a value of the wrong type."""


def _count(limit: CompiledLimit, activation: Activation) -> LimitCall | None:
    def value(key: str, program: Program) -> Any:
        try:
            return program.evaluate(activation)
        except EvaluationError as exc:
            raise _LimitBroke(f"{key}: {error_in_words(str(exc), limit.text(key) or '')}") from None

    holds = value("when", limit.when)
    if not isinstance(holds, bool):
        raise _LimitBroke(f"'when' must be a bool, got {type(holds).__name__}")
    if not holds:
        return None
    key = ""
    if limit.key is not None:
        found = value("key", limit.key)
        # A string, as the folder check requires of a key's type: a dynamic
        # value that is 123 at run time would share a count with "123".
        if not isinstance(found, str):
            raise _LimitBroke(f"'key' must be a string, got {type(found).__name__}")
        key = found
    cost = 1.0
    if limit.cost is not None:
        found = value("cost", limit.cost)
        if isinstance(found, bool) or not isinstance(found, int | float):
            # The type only: the value may be input (SI-5).
            raise _LimitBroke(f"'cost' must be a number, got {type(found).__name__}")
        if found < 0:
            raise _LimitBroke("'cost' must not be negative")
        cost = float(found)
    return LimitCall(limit, key, cost)
