"""How a policy set decides one request, step by step: the author's playground.

``explain`` runs the same steps as the plane — visibility (hide rules, before
the input is validated), input validation against the capability's schema
when it is known, then the other rules by precedence — and keeps every
rule's value or error, and why the decision is what it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from warden_server.policy.engine import Decision, PolicySet, RuleResult, would_have
from warden_server.policy.model import EFFECT_PRECEDENCE
from warden_server.policy.variables import decision_variables

PRECEDENCE = " > ".join(EFFECT_PRECEDENCE)


@dataclass(frozen=True, slots=True)
class RuleLine:
    """One rule considered, and what its condition gave."""

    stage: str
    """``visibility`` (hide rules) or ``policy`` (the others)."""
    id: str
    effect: str
    mode: str
    where: str
    """``file:line`` of the rule."""
    when: str
    value: bool | None
    """The condition's value; None when it failed."""
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "id": self.id,
            "effect": self.effect,
            "mode": self.mode,
            "where": self.where,
            "when": self.when,
            "value": self.value,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class Explanation:
    """One request's decision, with every rule considered and the reason."""

    capability: Mapping[str, Any]
    rules: tuple[RuleLine, ...]
    effect: str
    """allow, deny, require_approval, hide, error, or ``invalid`` (the input
    fails the capability's schema, so no policy rule runs)."""
    reason: str
    rule: str | None = None
    message: str | None = None
    would_have: Mapping[str, Any] | None = None
    """The decision had the audit-mode rules been enforced, when it differs."""
    input_issues: Sequence[Mapping[str, str]] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "capability": dict(self.capability),
            "rules": [r.to_json() for r in self.rules],
            "decision": {
                "effect": self.effect,
                "rule": self.rule,
                "message": self.message,
                "reason": self.reason,
                "would_have": dict(self.would_have) if self.would_have else None,
            },
            "input_issues": [dict(i) for i in self.input_issues],
        }


def explain(
    policies: PolicySet,
    *,
    capability: Mapping[str, Any],
    actor: Mapping[str, Any],
    input: Any,
    context: Mapping[str, Any],
    now: datetime,
    input_issues: Sequence[Mapping[str, str]] = (),
) -> Explanation:
    """Decide one request as the plane would, keeping every step.

    Args:
        policies: The compiled set.
        capability: The ``capability`` variable (``id``, ``version``, ...).
        actor: The ``actor`` variable, as built from verified claims.
        input: The call's input.
        context: The caller's context; ``surface`` defaults to ``direct``.
        now: The time of the decision.
        input_issues: Where the input fails the capability's schema, if it
            does (validation runs between visibility and policy).
    """
    capability_id = str(capability["id"])
    extra = dict(context)
    surface = str(extra.pop("surface", "direct"))
    base = policies.activation(
        decision_variables(
            actor=actor, capability=capability, context=extra, surface=surface, now=now
        )
    )
    hidden = policies.visibility(capability_id, base)
    lines = _lines(policies, capability_id, "visibility", hidden.results)
    if hidden.effect == "hide":
        reason = (
            f"hidden by {hidden.rule_id!r}: hide rules decide first, before the input is "
            "validated; the call fails CAPABILITY_NOT_FOUND, like an unknown id"
            if hidden.rule is not None
            else "a hide rule failed to evaluate, and a failing hide rule conceals the "
            "capability: the call fails CAPABILITY_NOT_FOUND"
        )
        return Explanation(capability, lines, "hide", reason, hidden.rule_id)
    if input_issues:
        return Explanation(
            capability,
            lines,
            "invalid",
            "the input fails the capability's input schema: the call fails INPUT_INVALID "
            "before any other rule runs (policies see only valid input)",
            input_issues=input_issues,
        )
    decision = policies.decide(capability_id, policies.activation({"input": input}, base))
    lines += _lines(policies, capability_id, "policy", decision.results)
    shadow = would_have(hidden, decision)
    return Explanation(
        capability,
        lines,
        decision.effect,
        _reason(policies, decision),
        decision.rule_id,
        decision.message,
        shadow.outcome_json() if shadow is not None else None,
    )


def _lines(
    policies: PolicySet, capability_id: str, stage: str, results: Sequence[RuleResult]
) -> tuple[RuleLine, ...]:
    rules = {r.id: r for r in policies.rules_for(capability_id)}
    lines = []
    for result in results:
        rule = rules[result.rule_id]
        lines.append(
            RuleLine(
                stage,
                result.rule_id,
                result.effect,
                result.mode,
                f"{rule.file}:{rule.line}",
                " ".join((rule.text("when") or "true").split()),
                None if result.error else result.matched,
                result.error,
            )
        )
    return tuple(lines)


def _reason(policies: PolicySet, decision: Decision) -> str:
    enforced = [r for r in decision.results if r.mode == "enforce"]
    if decision.effect == "error":
        failed = [repr(r.rule_id) for r in enforced if r.error]
        return (
            f"{'rules' if len(failed) > 1 else 'rule'} {', '.join(failed)} failed to evaluate: "
            "an enforced rule that fails makes the "
            "decision fail closed (POLICY_FAILED), whatever the other rules say"
        )
    matched = [r for r in enforced if r.matched]
    if not matched:
        return f"no enforced rule matched: the default effect applies ({policies.default_effect})"
    winner = decision.rule_id
    others = [f"{r.rule_id!r} ({r.effect})" for r in matched if r.rule_id != winner]
    reason = f"precedence {PRECEDENCE}: {winner!r} ({decision.effect}) decides"
    if others:
        reason += f" over {', '.join(others)}"
    if any(r.effect == decision.effect for r in matched if r.rule_id != winner):
        reason += "; among rules of the same effect, the first in load order decides"
    return reason
