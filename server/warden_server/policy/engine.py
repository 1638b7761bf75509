"""A compiled policy set and the decisions it makes.

Compiled once per revision; a request only builds its activation once and
evaluates the rules indexed for its capability.
"""

from __future__ import annotations

import fnmatch
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from warden_server.policy.cel import Activation, EvaluationError, Evaluator, Program
from warden_server.policy.model import EFFECT_PRECEDENCE, Effect, Rule

Outcome = Effect | Literal["error"]


@dataclass(frozen=True, slots=True)
class CompiledRule:
    rule: Rule
    file: str
    line: int
    when: Program
    message_expr: Program | None
    approvers: Program | None
    ttl_seconds: int | None

    @property
    def id(self) -> str:
        return self.rule.id

    def applies_to(self, capability_id: str) -> bool:
        return any(fnmatch.fnmatchcase(capability_id, glob) for glob in self.rule.capabilities)


@dataclass(frozen=True, slots=True)
class RuleResult:
    """How one rule evaluated in one decision (recorded in the audit log)."""

    rule_id: str
    effect: Effect
    mode: str
    matched: bool
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.rule_id,
            "effect": self.effect,
            "mode": self.mode,
            "matched": self.matched,
        }
        if self.error:
            data["error"] = self.error
        return data


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of evaluating a policy set for one request."""

    effect: Outcome
    revision: str
    rule: CompiledRule | None = None
    message: str | None = None
    results: tuple[RuleResult, ...] = ()

    @property
    def rule_id(self) -> str | None:
        return self.rule.id if self.rule else None

    def rules_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.results]


@dataclass(slots=True)
class PolicySet:
    """A whole, compiled policy set: swapped atomically, never edited (SI-12)."""

    revision: str
    rules: tuple[CompiledRule, ...]
    files: tuple[str, ...]
    evaluator: Evaluator
    default_effect: Literal["allow", "deny"] = "deny"
    _index: dict[str, tuple[CompiledRule, ...]] = field(default_factory=dict, repr=False)
    _index_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def rules_for(self, capability_id: str) -> tuple[CompiledRule, ...]:
        """The rules whose globs match the capability, in load order (memoized)."""
        found = self._index.get(capability_id)
        if found is None:
            found = tuple(r for r in self.rules if r.applies_to(capability_id))
            with self._index_lock:
                if len(self._index) > 10_000:
                    self._index.clear()
                self._index[capability_id] = found
        return found

    def activation(self, variables: dict[str, Any]) -> Activation:
        return self.evaluator.activation(variables)

    def visibility(self, capability_id: str, activation: Activation) -> Decision:
        """Step 4: ``hide`` if an enforced hide rule matches, else ``allow``.

        A hide rule that fails to evaluate conceals too: revealing that a
        capability exists is itself a disclosure.
        """
        results = []
        hiding: CompiledRule | None = None
        failed = False
        for rule in self.rules_for(capability_id):
            if rule.rule.effect != "hide":
                continue
            result = _evaluate(rule, activation)
            results.append(result)
            if result.matched and rule.rule.mode == "enforce" and hiding is None:
                hiding = rule
            failed = failed or (result.error is not None and rule.rule.mode == "enforce")
        if hiding is not None or failed:
            return Decision("hide", self.revision, hiding, None, tuple(results))
        return Decision("allow", self.revision, None, None, tuple(results))

    def decide(self, capability_id: str, activation: Activation) -> Decision:
        """Step 7: every non-hide rule for the capability, by precedence.

        deny beats require_approval beats allow; with no match the default
        applies; an enforced rule that fails to evaluate fails closed (``error``).
        """
        results = []
        matched: dict[str, CompiledRule] = {}
        failed = False
        for rule in self.rules_for(capability_id):
            if rule.rule.effect == "hide":
                continue
            result = _evaluate(rule, activation)
            results.append(result)
            if rule.rule.mode != "enforce":
                continue
            if result.error is not None:
                failed = True
            elif result.matched:
                matched.setdefault(rule.rule.effect, rule)
        if failed:
            return Decision("error", self.revision, None, None, tuple(results))
        for effect in EFFECT_PRECEDENCE:
            if effect in matched:
                rule = matched[effect]
                return Decision(
                    effect, self.revision, rule, _message(rule, activation), tuple(results)
                )
        return Decision(self.default_effect, self.revision, None, None, tuple(results))


def _evaluate(rule: CompiledRule, activation: Activation) -> RuleResult:
    try:
        value = rule.when.evaluate(activation)
    except EvaluationError as exc:
        return RuleResult(rule.id, rule.rule.effect, rule.rule.mode, False, str(exc))
    if not isinstance(value, bool):
        return RuleResult(
            rule.id,
            rule.rule.effect,
            rule.rule.mode,
            False,
            f"'when' must be a bool, got {type(value).__name__}",
        )
    return RuleResult(rule.id, rule.rule.effect, rule.rule.mode, value)


def _message(rule: CompiledRule, activation: Activation) -> str | None:
    if rule.message_expr is not None:
        try:
            value = rule.message_expr.evaluate(activation)
        except EvaluationError:
            value = None
        if isinstance(value, str) and value:
            return value
    return rule.rule.message
