"""Condition coverage for policy tests, in the manner of branch coverage.

A rule's condition has outcomes to see: the condition itself true and
false, and each operand of every ``&&`` and ``||`` in it true and false.
The test runner evaluates each operand on its own, with the evaluator and
the variables of the case, for every case that evaluates the rule. A case
in which the rule fails to evaluate counts for none of its outcomes: an
erroring rule is never covered.

Operands that read no variable (``true``) cannot vary and have no
outcomes; nor have operands inside a macro (``all``, ``exists``, ...),
whose bound variable exists only within it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import lark

from warden_server.policy.cel import MACROS, Activation, EvaluationError, Program, parse
from warden_server.policy.engine import CompiledRule, PolicySet, RuleResult


@dataclass(frozen=True, slots=True)
class Condition:
    """One condition of a rule whose outcomes are counted."""

    rule_id: str
    where: str
    """``file:line`` of the rule."""
    text: str
    """The operand (or the whole condition) as evaluated."""
    program: Program | None
    """The operand compiled on its own; None for the whole condition, whose
    value is the rule's result."""


@dataclass(slots=True)
class ConditionCoverage:
    """The outcomes every condition of a set has been seen to take."""

    conditions: dict[str, list[Condition]] = field(default_factory=dict)
    """By rule id: the whole condition first, then its operands in source order."""
    seen: dict[tuple[str, int], set[bool]] = field(default_factory=dict)

    @classmethod
    def of(cls, policies: PolicySet) -> ConditionCoverage:
        coverage = cls()
        for rule in policies.rules:
            coverage.conditions[rule.id] = list(_conditions(rule, policies))
        return coverage

    def record(self, result: RuleResult, activation: Activation) -> None:
        """Count one rule's evaluation in one case (nothing, if it failed)."""
        conditions = self.conditions.get(result.rule_id, [])
        if result.error is not None or not conditions:
            return
        self.seen.setdefault((result.rule_id, 0), set()).add(result.matched)
        for index, condition in enumerate(conditions[1:], start=1):
            assert condition.program is not None
            try:
                value = condition.program.evaluate(activation)
            except EvaluationError:
                continue
            if isinstance(value, bool):
                self.seen.setdefault((result.rule_id, index), set()).add(value)

    @property
    def outcomes(self) -> int:
        """How many outcomes there are to see: two per condition."""
        return 2 * sum(len(c) for c in self.conditions.values())

    @property
    def outcomes_seen(self) -> int:
        return sum(len(values) for values in self.seen.values())

    def unseen(self) -> list[str]:
        """Each outcome no case produced, as ``file:line: rule: `text` never true``."""
        missing = []
        for rule_id, conditions in self.conditions.items():
            for index, condition in enumerate(conditions):
                values = self.seen.get((rule_id, index), set())
                never = [
                    word
                    for value, word in ((True, "true"), (False, "false"))
                    if value not in values
                ]
                if never:
                    what = "the condition" if index == 0 else "operand"
                    missing.append(
                        f"{condition.where}: {rule_id}: {what} `{condition.text}` "
                        f"never {' or '.join(never)}"
                    )
        return missing


def _conditions(rule: CompiledRule, policies: PolicySet) -> Iterator[Condition]:
    text = rule.text("when") or "true"
    try:
        tree = parse(text)
    except Exception:  # the set compiled, so this does not happen; count nothing
        return
    where = f"{rule.file}:{rule.line}"
    if not _reads_a_variable(tree):
        return
    yield Condition(rule.id, where, " ".join(text.split()), None)
    for node in _operands(tree):
        snippet = text[node.meta.start_pos : node.meta.end_pos]
        yield Condition(
            rule.id, where, " ".join(snippet.split()), policies.evaluator.compile(snippet)
        )


def _operands(tree: lark.Tree[Any]) -> Iterator[lark.Tree[Any]]:
    """The operands of every ``&&``/``||`` chain, outside macros, in source order."""
    found: list[lark.Tree[Any]] = []

    def walk(node: lark.Tree[Any], in_chain: bool) -> None:
        is_macro = node.data == "member_dot_arg" and len(node.children) > 1
        if is_macro and str(node.children[1]) in MACROS:
            return
        if node.data in ("conditionalor", "conditionaland") and len(node.children) == 2:
            left, right = node.children
            if not in_chain:
                for operand in _chain(node):
                    if _reads_a_variable(operand):
                        found.append(operand)
            walk(left, in_chain=isinstance(left, lark.Tree) and left.data == node.data)
            walk(right, in_chain=False)
            return
        for child in node.children:
            if isinstance(child, lark.Tree):
                walk(child, in_chain=False)

    walk(tree, in_chain=False)
    found.sort(key=lambda n: n.meta.start_pos)
    yield from found


def _chain(node: lark.Tree[Any]) -> list[lark.Tree[Any]]:
    """``a && b && c`` (left-nested in the parse tree) as [a, b, c]."""
    operands: list[lark.Tree[Any]] = []
    while (
        isinstance(node, lark.Tree)
        and len(node.children) == 2
        and isinstance(node.children[0], lark.Tree)
    ):
        left, right = node.children
        operands.insert(0, right)
        if left.data != node.data or len(left.children) != 2:
            operands.insert(0, left)
            break
        node = left
    return operands


def _reads_a_variable(node: lark.Tree[Any]) -> bool:
    return any(sub.data == "ident" for sub in node.iter_subtrees())
