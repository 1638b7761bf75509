"""Schema validation whose cost a model's input cannot blow up (ReDoS and
friends): patterns run on RE2, which refuses what needs backtracking, and
``uniqueItems`` compares items by their JSON text.

These assert which engine runs and what it answers, never how long it takes:
an evil pattern with a long input must be validated correctly, and a pattern
only a backtracking engine can run must be refused when the schema is compiled.
"""

from __future__ import annotations

from typing import Any

import pytest

from warden.shared.patterns import PatternError, compile_pattern
from warden.shared.schema import InvalidSchemaError, Issue, compile_validator, validation_issues

EVIL = "^(a+)+$"
"""Exponential on a backtracking engine: 27 ``a`` and a ``!`` held the plane for seconds."""
LONG = 24
"""Long enough to be evil, short enough that a backtracking engine, if one
came back, would still answer (slowly) instead of hanging the suite."""


def test_redos_evil_pattern_validates_a_long_input_correctly() -> None:
    validator = compile_validator(
        {"type": "object", "properties": {"s": {"type": "string", "pattern": EVIL}}}
    )
    assert validation_issues(validator, {"s": "a" * LONG + "!"}) == [
        Issue("/s", f"must match the pattern {EVIL!r}")
    ]
    assert validation_issues(validator, {"s": "a" * LONG}) == []


def test_redos_evil_pattern_properties_and_additional_properties_validate_correctly() -> None:
    validator = compile_validator(
        {
            "type": "object",
            "patternProperties": {"^x-(a+)+$": {"type": "integer"}},
            "additionalProperties": False,
        }
    )
    bad_name = "x-" + "a" * LONG + "!"
    good_name = "x-" + "a" * LONG
    assert validation_issues(validator, {bad_name: 1, good_name: "text"}) == [
        Issue("/" + good_name, "must be of type integer"),
        Issue("/" + bad_name, "is not an allowed property"),
    ]


def test_redos_property_names_run_on_re2() -> None:
    validator = compile_validator({"type": "object", "propertyNames": {"pattern": EVIL}})
    assert validation_issues(validator, {"a" * LONG + "!": 1}) == [
        Issue("", f"must match the pattern {EVIL!r}")
    ]


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"^(a)\1$", "backreference"),
        (r"^(?=a)a+$", "lookahead"),
        (r"^(?!b)a+$", "negative lookahead"),
        (r"(?<=a)b", "lookbehind"),
    ],
    ids=["backreference", "lookahead", "negative-lookahead", "lookbehind"],
)
def test_redos_backtracking_constructs_are_refused(pattern: str, why: str) -> None:
    with pytest.raises(PatternError, match="not supported by RE2"):
        compile_pattern(pattern)


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "string", "pattern": r"(a)\1"}, "at /pattern:"),
        (
            {"properties": {"code": {"type": "string", "pattern": r"^(?=x)x$"}}},
            "at /properties/code/pattern:",
        ),
        (
            {"$defs": {"tag": {"patternProperties": {r"(a)\1": {}}}}},
            r"at /$defs/tag/patternProperties/(a)\1:",
        ),
        (
            {"items": {"anyOf": [{"type": "integer"}, {"pattern": r"(?<=a)b"}]}},
            "at /items/anyOf/1/pattern:",
        ),
    ],
    ids=["root", "property", "pattern-properties-in-defs", "inside-anyof"],
)
def test_redos_a_pattern_re2_cannot_run_is_refused_naming_where(
    schema: dict[str, Any], where: str
) -> None:
    with pytest.raises(InvalidSchemaError) as raised:
        compile_validator(schema)
    assert where in str(raised.value)
    assert "not supported by RE2" in str(raised.value)


def test_redos_pattern_like_data_in_enum_and_const_is_not_a_pattern() -> None:
    """Only schema positions hold patterns; values of enum and const are data."""
    schema = {"enum": [{"pattern": r"(a)\1"}], "const": {"pattern": r"(?=a)"}}
    compile_validator(schema)


def test_redos_unevaluated_properties_beside_pattern_properties_is_refused() -> None:
    """jsonschema matches patternProperties with Python's re when it works out
    what unevaluatedProperties leaves over, so the pair is refused."""
    schema = {"patternProperties": {"^a": {}}, "unevaluatedProperties": False}
    with pytest.raises(InvalidSchemaError, match="unevaluatedProperties cannot be combined"):
        compile_validator(schema)


def test_redos_format_regex_checks_with_re2() -> None:
    validator = compile_validator({"type": "string", "format": "regex"})
    assert validation_issues(validator, "^[a-z]+$") == []
    assert validation_issues(validator, r"(a)\1") == [Issue("", "must be a valid regex")]


@pytest.mark.parametrize(
    ("items", "unique"),
    [
        ([1, 2, 3], True),
        ([1, 1.0], False),
        ([True, 1], True),
        ([{"a": 1, "b": [1, 2]}, {"b": [1, 2.0], "a": 1.0}], False),
        ([{"a": 1}, {"a": True}], True),
        (["1", 1], True),
        ([None, None], False),
        ([[1, 2], [2, 1]], True),
    ],
    ids=[
        "distinct",
        "int-float",
        "bool-int",
        "objects-equal",
        "objects-bool",
        "string-int",
        "nulls",
        "order-matters",
    ],
)
def test_unique_items_compares_by_json_equality(items: list[Any], unique: bool) -> None:
    validator = compile_validator({"type": "array", "uniqueItems": True})
    issues = validation_issues(validator, items)
    assert issues == ([] if unique else [Issue("", "must not contain duplicate items")])


def test_unique_items_over_many_objects_finds_the_one_duplicate() -> None:
    validator = compile_validator({"type": "array", "uniqueItems": True})
    items: list[Any] = [{"n": n} for n in range(2_000)]
    assert validation_issues(validator, items) == []
    items.append({"n": 1_999.0})
    assert validation_issues(validator, items) == [Issue("", "must not contain duplicate items")]
