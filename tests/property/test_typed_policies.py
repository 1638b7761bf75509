"""The type checker agrees with both evaluators (hypothesis).

A capability's input schema, an input valid for it and a condition over its
fields, the actor and literals are generated together. Whenever the checker
accepts the condition, both cel-python and the C++ runtime evaluate it, on
that input as the plane hands it to policies, to a bool or to an error that
is not about types (division by zero, overflow): never to "no operator",
"no such overload" or a non-bool.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from warden.shared.canonical import canonical_json
from warden_server.policy import celcpp, typecheck
from warden_server.policy.cel import CelPythonEvaluator, EvaluationError, error_in_words
from warden_server.policy.inputs import InputSchema

pytestmark = pytest.mark.skipif(
    celcpp.available() is not None, reason="the C++ CEL runtime is not installed"
)

TYPE_ERRORS = ("no operator", "no function", "overload", "field selection", "no such key")


@dataclass(frozen=True)
class Term:
    text: str
    kind: str
    """string, int, double, bool, list(string), list(int)"""


# Each JSON Schema type, the CEL type it must check as, and valid values.
FIELD_TYPES: dict[str, tuple[dict[str, Any], str, st.SearchStrategy[Any]]] = {
    "string": ({"type": "string"}, "string", st.text(alphabet="abc", max_size=3)),
    "integer": ({"type": "integer"}, "int", st.integers(-1000, 1000)),
    "number": (
        {"type": "number"},
        "double",
        # As JSON numbers arrive: whole ones too (100, or 100.0, read back as 100).
        st.one_of(st.integers(-1000, 1000), st.floats(-1000, 1000, allow_nan=False)),
    ),
    "boolean": ({"type": "boolean"}, "bool", st.booleans()),
    "enum": ({"type": "string", "enum": ["a", "b"]}, "string", st.sampled_from(["a", "b"])),
    "strings": (
        {"type": "array", "items": {"type": "string"}},
        "list(string)",
        st.lists(st.text(alphabet="ab", max_size=2), max_size=3),
    ),
    "integers": (
        {"type": "array", "items": {"type": "integer"}},
        "list(int)",
        st.lists(st.integers(-5, 5), max_size=3),
    ),
}
LITERALS = [
    Term('"a"', "string"),
    Term("3", "int"),
    Term("0", "int"),
    Term("2.5", "double"),
    Term("true", "bool"),
    Term('["a", "b"]', "list(string)"),
    Term("[1, 2]", "list(int)"),
]
ACTOR = [
    Term("actor.id", "string"),
    Term("actor.tenant", "string"),
    Term("actor.roles", "list(string)"),
]
COMPARISONS = ("==", "!=", "<", ">", "<=", ">=")
ARITHMETIC = ("+", "-", "*", "/")


@st.composite
def schema_and_input(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], list[Term]]:
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=1, unique=True))
    properties: dict[str, Any] = {}
    value: dict[str, Any] = {}
    terms: list[Term] = []
    for name in names:
        kind = draw(st.sampled_from(sorted(FIELD_TYPES)))
        schema, cel_type, values = FIELD_TYPES[kind]
        if draw(st.booleans()):
            properties[name] = schema
            value[name] = draw(values)
            terms.append(Term(f"input.{name}", cel_type))
        else:  # one level down
            properties[name] = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
            value[name] = {"x": draw(values)}
            terms.append(Term(f"input.{name}.x", cel_type))
    schema = {"type": "object", "properties": properties, "required": sorted(properties)}
    return schema, value, terms


@st.composite
def term(draw: st.DrawFn, terms: list[Term]) -> Term:
    base = draw(st.sampled_from(terms + LITERALS + ACTOR))
    shape = draw(st.integers(0, 9))
    if shape == 0:
        return Term(f"size({base.text})", "int")
    if shape == 1:
        pool = terms + LITERALS + ACTOR
        # Mostly an operand of the same type, so that much arithmetic checks.
        same = [t for t in pool if t.kind == base.kind]
        other = draw(st.sampled_from(same if same and draw(st.integers(0, 9)) else pool))
        op = draw(st.sampled_from(ARITHMETIC))
        return Term(f"({base.text} {op} {other.text})", base.kind)
    return base


@st.composite
def condition(draw: st.DrawFn, terms: list[Term], depth: int = 0) -> str:
    shape = draw(st.integers(0, 6 if depth < 2 else 3))
    left = draw(term(terms))
    pool = terms + LITERALS + ACTOR
    # Mostly a right side of the same type, so that many conditions check.
    same = [t for t in pool if t.kind == left.kind]
    right = draw(st.sampled_from(same if same and draw(st.integers(0, 9)) else pool))
    if shape == 0:
        return left.text
    if shape == 1:
        return f"{right.text} in {left.text}"
    if shape == 2:
        method = draw(st.sampled_from(["startsWith", "contains", "endsWith"]))
        return f"({left.text}).{method}({right.text})"
    if shape == 3:
        return f"{left.text} {draw(st.sampled_from(COMPARISONS))} {right.text}"
    if shape == 4:
        return f"!({draw(condition(terms, depth + 1))})"
    op = "&&" if shape == 5 else "||"
    return f"({draw(condition(terms, depth + 1))}) {op} ({draw(condition(terms, depth + 1))})"


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], str]:
    schema, value, terms = draw(schema_and_input())
    return schema, value, draw(condition(terms))


CHECKER = typecheck.TypeChecker()
EVALUATORS = (CelPythonEvaluator(), celcpp.CelCppEvaluator())
ACTOR_VALUE = {"id": "bot-7", "roles": ["support"], "tenant": "acme", "attrs": {}}


@pytest.mark.heavy
@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_no_expression_that_passes_the_checker_fails_with_a_type_error(
    case: tuple[dict[str, Any], dict[str, Any], str],
) -> None:
    schema, value, text = case
    schemas = [InputSchema("orders.refund", schema, "1")]
    reference = EVALUATORS[0].compile(text)
    if CHECKER.check(text, "when", schemas, reference.references):
        event("refused by the checker")
        return
    event("accepted by the checker")
    # As the plane hands a valid input to policies: read back from its
    # canonical form, then typed as the checker typed it.
    typing = typecheck.number_typing(schema)
    value = orjson.loads(canonical_json(value))
    value = typing(value) if typing is not None else value
    variables = {
        "actor": ACTOR_VALUE,
        "capability": {"id": "orders.refund", "version": "1", "service": "orders"},
        "context": {"surface": "direct"},
        "now": datetime(2025, 1, 1, tzinfo=UTC),
        "input": value,
    }
    for evaluator in EVALUATORS:
        program = evaluator.compile(text)
        try:
            result = program.evaluate(evaluator.activation(variables))
        except EvaluationError as exc:
            words = error_in_words(str(exc), text)
            assert not any(kind in words for kind in TYPE_ERRORS), (evaluator.name, text, words)
            continue
        assert isinstance(result, bool), (evaluator.name, text, result)


NUMBER_SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "number"},
        "b": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
        "c": {"type": "array", "items": {"type": "number"}},
        "d": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    },
    "required": ["a", "b", "c", "d"],
}
JSON_NUMBERS = st.one_of(st.integers(-1000, 1000), st.floats(-1000, 1000, allow_nan=False))
NUMBER_TERMS = ["input.a", "input.b.x", "2.5", "1.0", "input.c[0]", "input.d"]


@st.composite
def arithmetic(draw: st.DrawFn, depth: int = 0) -> str:
    if depth > 2 or draw(st.booleans()):
        return draw(st.sampled_from(NUMBER_TERMS))
    op = draw(st.sampled_from(("+", "-", "*")))
    return f"({draw(arithmetic(depth + 1))} {op} {draw(arithmetic(depth + 1))})"


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "a": JSON_NUMBERS,
            "b": st.fixed_dictionaries({"x": JSON_NUMBERS}),
            "c": st.lists(JSON_NUMBERS, min_size=1, max_size=3),
            "d": JSON_NUMBERS,
        }
    ),
    arithmetic(),
    st.sampled_from(COMPARISONS),
    arithmetic(),
)
def test_numbers_the_checker_types_double_evaluate_as_doubles(
    value: dict[str, Any], left: str, comparison: str, right: str
) -> None:
    """Every JSON number, whole ones included, of a field the schema says is a
    ``number`` reaches a rule as the double the checker typed it: arithmetic
    and comparisons with double literals evaluate on both evaluators."""
    text = f"{left} {comparison} {right}"
    schemas = [InputSchema("orders.refund", NUMBER_SCHEMA, "1")]
    reference = EVALUATORS[0].compile(text)
    assert CHECKER.check(text, "when", schemas, reference.references) == [], text
    typing = typecheck.number_typing(NUMBER_SCHEMA)
    assert typing is not None
    served = typing(orjson.loads(canonical_json(value)))
    for evaluator in EVALUATORS:
        program = evaluator.compile(text)
        result = program.evaluate(evaluator.activation({"input": served}))
        assert isinstance(result, bool), (evaluator.name, text, result)


def test_the_generated_conditions_include_well_typed_ones() -> None:
    """The property above says something only if the checker accepts some
    conditions: these, drawn by hand from the same grammar, all check."""
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "array", "items": {"type": "string"}},
        },
    }
    schemas = [InputSchema("orders.refund", schema, "1")]
    for text in ("input.a > 3", '"a" in input.b', "size(input.b) == input.a", 'actor.id != "a"'):
        reference = EVALUATORS[0].compile(text)
        assert CHECKER.check(text, "when", schemas, reference.references) == [], text
