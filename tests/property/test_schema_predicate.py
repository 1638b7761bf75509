"""The compiled schema predicate against jsonschema (hypothesis).

Valid input is recognised by the predicate alone (``validation_issues`` skips
jsonschema when it says yes), so a predicate that accepted what jsonschema
refuses would let invalid input through (SI-2). Schemas are generated from
every keyword the predicate covers, instances both near each schema and
arbitrary, and the two verdicts must be the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warden.shared.schema import compile_validator, validation_issues
from warden.shared.schema_predicate import compile_predicate

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-50, 50)
    | st.sampled_from([0.0, 1.0, 2.5, -1.5, 1e300])
    | st.text(alphabet="ab1-@.", max_size=6)
)
any_json = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), children, max_size=4)
    ),
    max_leaves=12,
)
NAMES = ["a", "b", "c", "d"]
ROOT = Path(__file__).resolve().parents[2]


def _maybe(
    draw: st.DrawFn, schema: dict[str, Any], key: str, values: st.SearchStrategy[Any]
) -> None:
    if draw(st.booleans()):
        schema[key] = draw(values)


@st.composite
def string_schema(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    _maybe(draw, schema, "minLength", st.integers(0, 3))
    _maybe(draw, schema, "maxLength", st.integers(0, 5))
    _maybe(draw, schema, "pattern", st.sampled_from(["^a", "b$", "[0-9]", "^[a-z]+$"]))
    _maybe(draw, schema, "format", st.sampled_from(["email", "ipv4", "date", "unknown-format"]))
    _maybe(draw, schema, "title", st.just("A title"))
    return schema


@st.composite
def number_schema(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": draw(st.sampled_from(["integer", "number"]))}
    bounds = st.integers(-5, 5) | st.sampled_from([0.5, -2.5])
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        _maybe(draw, schema, key, bounds)
    if draw(st.booleans()):
        del schema["type"]  # bounds apply to numbers only, whatever else comes
    return schema


leaf_schemas = (
    string_schema()
    | number_schema()
    | st.sampled_from(
        [
            {"type": "boolean"},
            {"type": "null"},
            {"type": ["string", "null"]},
            {"type": ["integer", "boolean"]},
            {"enum": ["a", "b", None]},
            {"const": "a"},
            {"const": None},
            {},
            {"description": "anything", "x-warden-sensitive": True},
            True,
            False,
        ]
    )
)


def _object(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3))
        schema: dict[str, Any] = {"properties": {name: draw(children) for name in names}}
        if draw(st.booleans()):
            schema["type"] = "object"
        _maybe(draw, schema, "required", st.lists(st.sampled_from(NAMES), unique=True, max_size=2))
        _maybe(draw, schema, "additionalProperties", st.booleans() | children)
        return schema

    return build()


def _array(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "array"}
        _maybe(draw, schema, "items", children)
        _maybe(draw, schema, "prefixItems", st.lists(children, min_size=1, max_size=2))
        _maybe(draw, schema, "minItems", st.integers(0, 2))
        _maybe(draw, schema, "maxItems", st.integers(0, 3))
        _maybe(draw, schema, "uniqueItems", st.booleans())
        return schema

    return build()


def _combined(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda keyword, branches: {keyword: branches},
        st.sampled_from(["anyOf", "allOf", "oneOf"]),
        st.lists(children, min_size=1, max_size=3),
    ) | st.builds(lambda inner: {"not": inner}, children)


schemas = st.recursive(
    leaf_schemas,
    lambda children: _object(children) | _array(children) | _combined(children),
    max_leaves=8,
)


@st.composite
def with_refs(draw: st.DrawFn) -> dict[str, Any] | bool:
    """A schema, sometimes reached through ``$ref`` into ``$defs``."""
    schema = draw(schemas)
    if isinstance(schema, dict) and draw(st.booleans()):
        return {"$defs": {"inner": schema}, "$ref": "#/$defs/inner"}
    return schema


def near(schema: Any) -> st.SearchStrategy[Any]:
    """Instances shaped like ``schema``: the ones a predicate bug would hide in."""
    if not isinstance(schema, dict):
        return any_json
    options: list[st.SearchStrategy[Any]] = [any_json]
    if "$ref" in schema:
        options.append(near(schema["$defs"]["inner"]))
    properties = schema.get("properties")
    if properties is not None:
        options.append(
            st.fixed_dictionaries(
                {},
                optional={name: near(sub) for name, sub in properties.items()} | {"d": any_json},
            )
        )
    for keyword in ("items", "prefixItems"):
        if keyword in schema:
            subs = schema[keyword] if keyword == "prefixItems" else [schema[keyword]]
            options.append(st.lists(st.one_of([near(sub) for sub in subs]), max_size=4))
    for keyword in ("anyOf", "allOf", "oneOf"):
        options.extend(near(sub) for sub in schema.get(keyword, []))
    if "not" in schema:
        options.append(near(schema["not"]))
    if "enum" in schema or "const" in schema:
        options.append(st.sampled_from(schema.get("enum", [schema.get("const")])))
    bounds = [schema[k] for k in BOUNDS if k in schema]
    if bounds:
        # On each bound, and either side of it, as integers and as floats.
        at = [b + d for b in bounds for d in (-1, 0, 1)]
        options.append(st.sampled_from(at + [float(v) for v in at]))
    lengths = [schema[k] for k in ("minLength", "maxLength") if k in schema]
    if lengths or "pattern" in schema:
        options.append(
            st.sampled_from(
                [n + d for n in lengths or [2] for d in (-1, 0, 1) if n + d >= 0]
            ).flatmap(lambda n: st.text(alphabet="ab1", min_size=n, max_size=n))
        )
    return st.one_of(options)


BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


@pytest.mark.heavy
@settings(max_examples=600, deadline=None)
@given(data=st.data(), schema=with_refs())
def test_si2_the_predicate_gives_jsonschemas_verdict(data: st.DataObject, schema: Any) -> None:
    validator = compile_validator(schema)
    assert validator.accepts is not None, f"the predicate should cover {schema}"
    instances = near(schema)
    for _ in range(8):
        instance = data.draw(instances)
        refused = list(validator.jsonschema.iter_errors(instance))
        assert validator.accepts(instance) == (not refused), (schema, instance, refused)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "multipleOf": 3},
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        {"if": {"type": "string"}, "then": {"minLength": 2}},
        {"type": "object", "minProperties": 1},
        {"enum": [1, 2]},
        {"$id": "https://example.com/s", "type": "string"},
        {"type": "object", "dependentRequired": {"a": ["b"]}},
        {"properties": {"a": {"unknownKeyword": 1}}},
    ],
)
def test_a_schema_with_a_keyword_the_predicate_lacks_gets_none_and_jsonschema_decides(
    schema: dict[str, Any],
) -> None:
    validator = compile_validator(schema)
    assert validator.accepts is None
    assert compile_predicate(schema, validator.jsonschema.format_checker) is None
    # jsonschema still refuses what the keyword forbids.
    bad = {
        "multipleOf": 4,
        "patternProperties": {"x1": 1},
        "if": "a",
        "minProperties": {},
        "enum": True,
        "$id": 5,
        "dependentRequired": {"a": 1},
        "unknownKeyword": None,
    }
    keyword = next(k for k in bad if k in str(schema))
    if keyword not in ("unknownKeyword", "$id"):
        assert validation_issues(validator, bad[keyword])


def test_recursive_references_compile_and_check_every_level() -> None:
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"next": {"$ref": "#/$defs/node"}, "n": {"type": "integer"}},
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    validator = compile_validator(schema)
    assert validator.accepts is not None
    assert validator.accepts({"n": 1, "next": {"n": 2, "next": {}}})
    assert not validator.accepts({"n": 1, "next": {"n": 2, "next": {"n": "three"}}})
    assert [i.path for i in validation_issues(validator, {"next": {"next": {"x": 1}}})] == [
        "/next/next/x"
    ]


def test_the_example_services_schemas_are_checked_by_the_predicate() -> None:
    """Generated schemas take the fast path: a predicate that covered none
    of them would leave every call on jsonschema."""
    snapshot = json.loads((ROOT / "policies" / "capabilities.json").read_text())
    for capability in snapshot["capabilities"]:
        for key in ("input_schema", "output_schema"):
            assert compile_validator(capability[key]).accepts is not None, (capability["id"], key)
