"""``typecheck.number_typing``: an input gets the types the checker gave it,
and only where the checker proves one."""

from __future__ import annotations

from typing import Any

from warden_server.policy.typecheck import number_typing

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "price": {"type": "number"},
        "count": {"type": "integer"},
        "flag": {"type": "boolean"},
        "discount": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "lines": {
            "type": "array",
            "items": {"$ref": "#/$defs/line"},
        },
        "rates": {"type": "object", "additionalProperties": {"type": "number"}},
        "grid": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        "free": {"type": "object"},
        "either": {"type": ["number", "string"]},
    },
    "$defs": {
        "line": {
            "type": "object",
            "properties": {"weight": {"type": "number"}, "sku": {"type": "string"}},
        }
    },
}


def test_whole_numbers_where_the_schema_says_number_become_doubles() -> None:
    typing = number_typing(SCHEMA)
    assert typing is not None
    typed = typing(
        {
            "price": 100,
            "count": 3,
            "flag": True,
            "discount": 5,
            "lines": [{"weight": 2, "sku": "A"}, {"weight": 2.5}],
            "rates": {"eu": 20, "us": 7.25},
            "extra": 1,
        }
    )
    assert typed == {
        "price": 100.0,
        "count": 3,
        "flag": True,
        "discount": 5.0,
        "lines": [{"weight": 2.0, "sku": "A"}, {"weight": 2.5}],
        "rates": {"eu": 20.0, "us": 7.25},
        "extra": 1,
    }
    assert type(typed["price"]) is float and type(typed["count"]) is int
    assert type(typed["lines"][0]["weight"]) is float
    assert typed["flag"] is True


def test_what_the_checker_types_dyn_is_left_as_it_is() -> None:
    """A list of lists, a free-form object and a union are dyn to the checker:
    rules compare them with ints or doubles as they are, so they stay so."""
    typing = number_typing(SCHEMA)
    assert typing is not None
    value = {"grid": [[1, 2]], "free": {"n": 1}, "either": 1, "discount": None}
    assert typing(value) == value
    assert type(typing(value)["grid"][0][0]) is int


def test_a_value_of_another_type_than_declared_is_left_alone() -> None:
    typing = number_typing(SCHEMA)
    assert typing is not None
    assert typing({"lines": "none", "rates": [1], "price": "1"}) == {
        "lines": "none",
        "rates": [1],
        "price": "1",
    }


def test_a_schema_without_numbers_needs_no_typing() -> None:
    assert number_typing({"type": "object", "properties": {"n": {"type": "integer"}}}) is None
    assert number_typing({"type": "object"}) is None
    assert number_typing({"type": "number"}) is None  # not an object: input is map(string, dyn)
