"""JSON Schema helpers: value-free validation issues, JSON pointer paths,
sensitive-field redaction, model-hidden fields and canonical digests."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from warden.shared.canonical import NotCanonicalizable, canonical_json, digest
from warden.shared.schema import (
    REDACTED,
    InvalidSchemaError,
    Issue,
    compile_validator,
    redact,
    strip_model_hidden,
    validation_issues,
)

# -- validation issues --------------------------------------------------------

STRICT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$", "enum": ["abc", "xyz"]},
        "code": {"const": "fixed"},
        "amount": {"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 7},
        "kind": {"type": "integer"},
        "when": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 1},
        "must": {},
    },
    "required": ["must"],
    "additionalProperties": False,
}

# Values that cannot occur in any message the schema could produce.
secret_text = st.text(min_size=1, max_size=20).map(lambda t: f"VALUE<{t}>")
secret_int = st.integers(min_value=10**9) | st.integers(max_value=-(10**9))


@settings(max_examples=150, deadline=None)
@given(text=secret_text, number=secret_int)
def test_issues_never_echo_input_values(text: str, number: int) -> None:
    """Whatever the model sent, no issue message (or path) repeats a value."""
    instance = {
        "name": text,
        "code": text,
        "amount": number,
        "kind": text,
        "when": text,
        "tags": [text, number],
        "extra": text,
    }
    issues = validation_issues(compile_validator(STRICT), instance)
    assert issues, "the instance is invalid in many ways"
    for issue in issues:
        for value in (text, str(number), json.dumps(text)):
            assert value not in issue.message
            assert value not in issue.path


def test_issue_messages_are_written_from_the_schema() -> None:
    issues = validation_issues(
        compile_validator(STRICT), {"must": 1, "amount": 101, "kind": "x", "tags": [1, 2]}
    )
    assert [i.to_json() for i in issues] == [
        {"path": "/amount", "message": "must be <= 100"},
        {"path": "/amount", "message": "must be a multiple of 7"},
        {"path": "/kind", "message": "must be of type integer"},
        {"path": "/tags", "message": "must have at most 1 items"},
    ]


def test_paths_are_json_pointers_with_escaping() -> None:
    """``~`` becomes ``~0`` and ``/`` becomes ``~1`` (RFC 6901)."""
    schema = {
        "type": "object",
        "properties": {
            "a/b": {
                "type": "object",
                "properties": {"c~d": {"type": "array", "items": {"type": "integer"}}},
            }
        },
    }
    issues = validation_issues(compile_validator(schema), {"a/b": {"c~d": [1, "two"]}})
    assert issues == [Issue("/a~1b/c~0d/1", "must be of type integer")]


def test_tilde_then_slash_escaping_order() -> None:
    """``~1`` in a name must become ``~01``, not ``/``'s escape."""
    schema = {"type": "object", "required": ["x~1y"]}
    assert validation_issues(compile_validator(schema), {}) == [Issue("/x~01y", "is required")]


def test_required_points_to_the_missing_property() -> None:
    schema = {
        "type": "object",
        "properties": {"inner": {"type": "object", "required": ["b", "a/z"]}},
        "required": ["inner", "top"],
    }
    assert validation_issues(compile_validator(schema), {"inner": {}}) == [
        Issue("/inner/a~1z", "is required"),
        Issue("/inner/b", "is required"),
        Issue("/top", "is required"),
    ]


def test_additional_properties_point_to_each_extra_property() -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {}},
        "patternProperties": {"^x-": {}},
        "additionalProperties": False,
    }
    instance = {"ok": 1, "x-fine": 2, "zz": 3, "a/b": 4}
    assert validation_issues(compile_validator(schema), instance) == [
        Issue("/a~1b", "is not an allowed property"),
        Issue("/zz", "is not an allowed property"),
    ]


def test_root_issue_has_the_empty_pointer() -> None:
    assert validation_issues(compile_validator({"type": "object"}), [1]) == [
        Issue("", "must be of type object")
    ]


def test_issues_are_sorted_and_independent_of_key_order() -> None:
    schema = {
        "type": "object",
        "properties": {k: {"type": "integer", "maximum": 1} for k in "abcdef"},
    }
    validator = compile_validator(schema)
    keys = list("fdbeca")
    baseline = validation_issues(validator, {k: "s" if k in "ace" else 5 for k in keys})
    assert baseline == sorted(baseline, key=lambda i: (i.path, i.message))
    assert [i.path for i in baseline] == ["/a", "/b", "/c", "/d", "/e", "/f"]
    for order in itertools.islice(itertools.permutations(keys), 30):
        shuffled = {k: "s" if k in "ace" else 5 for k in order}
        assert validation_issues(validator, shuffled) == baseline


def test_valid_instance_has_no_issues() -> None:
    validator = compile_validator(STRICT)
    assert validation_issues(validator, {"must": True, "name": "abc", "amount": 14}) == []


def test_a_reference_to_a_boolean_schema_is_a_schema_like_any_other() -> None:
    validator = compile_validator(
        {
            "$defs": {"anything": True, "nothing": False},
            "properties": {
                "free": {"$ref": "#/$defs/anything"},
                "gone": {"$ref": "#/$defs/nothing"},
            },
        }
    )
    assert validation_issues(validator, {"free": [1, "x"]}) == []
    assert validation_issues(validator, {"gone": "value-123"}) == [Issue("/gone", "is not allowed")]
    with pytest.raises(InvalidSchemaError, match="does not resolve"):
        compile_validator({"properties": {"a": {"$ref": "#/$defs/missing"}}})


@pytest.mark.parametrize(
    "reference",
    [
        {"$dynamicRef": "http://127.0.0.1:9/schema"},
        {"$dynamicRef": "file:///etc/passwd"},
        {"$ref": "https://schemas.example/x.json"},
    ],
    ids=["dynamic-url", "dynamic-file", "remote-ref"],
)
def test_no_reference_reaches_outside_the_schema(reference: dict[str, str]) -> None:
    """A schema is the whole rule: a reference to a URL or a file would make
    the plane fetch it on every call, and let the rule change after its
    digest was taken."""
    with pytest.raises(InvalidSchemaError, match="is remote; put the schema under"):
        compile_validator({"type": "object", "properties": {"a": reference}})


def test_references_resolve_at_registration_as_the_validator_resolves_them() -> None:
    """A plain-name fragment needs its ``$anchor``; a pointer is
    percent-decoded: what registers, validates (an invalid input is an
    issue, never an error of the plane)."""
    with pytest.raises(InvalidSchemaError, match="does not resolve"):
        compile_validator({"properties": {"a": {"$ref": "#nope"}}})
    with pytest.raises(InvalidSchemaError, match="does not resolve"):
        compile_validator(
            {"$defs": {"a%20b": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/a%20b"}}}
        )
    for schema in (
        {"$defs": {"a b": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/a%20b"}}},
        {
            "$defs": {"s": {"$anchor": "str", "type": "string"}},
            "properties": {"a": {"$ref": "#str"}},
        },
    ):
        validator = compile_validator(schema)
        assert validation_issues(validator, {"a": 1}) == [Issue("/a", "must be of type string")]
        assert validation_issues(validator, {"a": "x"}) == []


def test_a_false_subschema_names_the_value_it_refuses() -> None:
    """A ``false`` under ``properties``, ``prefixItems`` or ``patternProperties``
    refuses one member or item: the issue is at that member's path, not at
    the object or array holding it."""
    members = compile_validator(
        {"properties": {"c": False, "d": {"type": "integer"}, "o": {"properties": {"x": False}}}}
    )
    assert validation_issues(members, {"c": 1, "d": "x", "o": {"x": [1]}}) == [
        Issue("/c", "is not allowed"),
        Issue("/d", "must be of type integer"),
        Issue("/o/x", "is not allowed"),
    ]
    items = compile_validator({"prefixItems": [{"type": "integer"}, False]})
    assert validation_issues(items, [1, "value-123"]) == [Issue("/1", "is not allowed")]
    patterned = compile_validator({"patternProperties": {"^x": False}})
    assert validation_issues(patterned, {"xa": 1, "b": 2}) == [Issue("/xa", "is not allowed")]


def test_invalid_schema_is_rejected() -> None:
    with pytest.raises(InvalidSchemaError, match="invalid JSON Schema at /properties/a/type"):
        compile_validator({"properties": {"a": {"type": "no-such-type"}}})


# -- redaction ----------------------------------------------------------------


class Card(BaseModel):
    number: str = Field(json_schema_extra={"x-warden-sensitive": True})
    holder: str


class Payment(BaseModel):
    card: Card
    backup: Card | None = None
    cards: list[Card] = []
    by_name: dict[str, Card] = {}
    pin: Card = Field(json_schema_extra={"x-warden-sensitive": True})
    note: str = Field("", json_schema_extra={"x-warden-model-visible": False})
    amount: int = 0


PAYMENT_SCHEMA = Payment.model_json_schema()


def card(n: str) -> dict[str, str]:
    return {"number": n, "holder": f"holder-{n}"}


def test_redact_through_ref_anyof_items_and_additional_properties() -> None:
    value = {
        "card": card("1111"),
        "backup": card("2222"),
        "cards": [card("3333"), card("4444")],
        "by_name": {"alice": card("5555")},
        "pin": card("6666"),
        "note": "n",
        "amount": 7,
    }
    assert redact(value, PAYMENT_SCHEMA) == {
        "card": {"number": REDACTED, "holder": "holder-1111"},
        "backup": {"number": REDACTED, "holder": "holder-2222"},
        "cards": [
            {"number": REDACTED, "holder": "holder-3333"},
            {"number": REDACTED, "holder": "holder-4444"},
        ],
        "by_name": {"alice": {"number": REDACTED, "holder": "holder-5555"}},
        "pin": REDACTED,
        "note": "n",
        "amount": 7,
    }
    assert value["card"]["number"] == "1111", "the original is not modified"


def test_redact_null_branch_and_custom_replacement() -> None:
    value = {"card": card("1"), "backup": None, "pin": card("2")}
    out = redact(value, PAYMENT_SCHEMA, replace=lambda v: "<" + type(v).__name__ + ">")
    assert out == {
        "card": {"number": "<str>", "holder": "holder-1"},
        "backup": None,
        "pin": "<dict>",
    }


def test_redact_through_allof_oneof_and_pattern_properties() -> None:
    schema = {
        "allOf": [{"properties": {"a": {"x-warden-sensitive": True}}}],
        "oneOf": [{"properties": {"b": {"x-warden-sensitive": True}}}],
        "patternProperties": {"^pw_": {"x-warden-sensitive": True}},
        "properties": {"items": {"prefixItems": [{}, {"x-warden-sensitive": True}]}},
    }
    value = {"a": 1, "b": [2], "pw_x": "p", "c": "keep", "items": ["keep", "hide"]}
    assert redact(value, schema) == {
        "a": REDACTED,
        "b": REDACTED,
        "pw_x": REDACTED,
        "c": "keep",
        "items": ["keep", REDACTED],
    }


def test_strip_model_hidden_removes_hidden_fields() -> None:
    value = {"card": card("1"), "pin": card("2"), "note": "internal", "amount": 3}
    assert strip_model_hidden(value, PAYMENT_SCHEMA) == {
        "card": card("1"),
        "pin": card("2"),
        "amount": 3,
    }


def test_strip_model_hidden_nested_through_ref() -> None:
    schema = {
        "$defs": {"Row": {"properties": {"debug": {"x-warden-model-visible": False}}}},
        "properties": {"rows": {"items": {"$ref": "#/$defs/Row"}}},
    }
    value = {"rows": [{"id": 1, "debug": "x"}, {"id": 2}]}
    assert strip_model_hidden(value, schema) == {"rows": [{"id": 1}, {"id": 2}]}


# A schema that marks "secret" sensitive at every level of any JSON value.
RECURSIVE_SCHEMA = {
    "$defs": {
        "node": {
            "properties": {"secret": {"x-warden-sensitive": True}},
            "additionalProperties": {"$ref": "#/$defs/node"},
            "items": {"$ref": "#/$defs/node"},
        }
    },
    "$ref": "#/$defs/node",
}

MARK = "SENSITIVE<"
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8).filter(lambda s: MARK not in s)
)
keys = st.sampled_from(["secret", "a", "b", "items", "properties"]) | st.text(max_size=6)
secrets = st.recursive(
    st.text(max_size=8).map(lambda t: MARK + t + ">"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=6,
)


def _objects(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    plain = st.dictionaries(keys.filter(lambda k: k != "secret"), children, max_size=4)
    return st.builds(
        lambda d, s: d if s is None else {**d, "secret": s}, plain, st.none() | secrets
    )


documents = st.recursive(
    scalars, lambda children: st.lists(children, max_size=4) | _objects(children), max_leaves=30
)


def _secret_values(value: Any) -> list[Any]:
    if isinstance(value, dict):
        found = [v for k, v in value.items() if k == "secret"]
        return found + [x for k, v in value.items() if k != "secret" for x in _secret_values(v)]
    if isinstance(value, list):
        return [x for v in value for x in _secret_values(v)]
    return []


def _without_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_secrets(v) for k, v in value.items() if k != "secret"}
    if isinstance(value, list):
        return [_without_secrets(v) for v in value]
    return value


@settings(max_examples=200, deadline=None)
@given(documents)
def test_no_sensitive_value_survives_redaction(document: Any) -> None:
    """At any depth, every "secret" is replaced and nothing else changes."""
    redacted = redact(document, RECURSIVE_SCHEMA)
    assert MARK not in json.dumps(redacted, ensure_ascii=False)
    assert all(v == REDACTED for v in _secret_values(redacted))
    assert len(_secret_values(redacted)) == len(_secret_values(document))
    assert _without_secrets(redacted) == _without_secrets(document)


# -- canonical digests --------------------------------------------------------

DOC = {"b": 1, "a": {"y": [1, 2, {"q": None, "p": True}], "x": "é"}, "c": 1.5}


def _reversed_keys(value: Any) -> Any:
    """The same value with every object's keys in reverse order, recursively."""
    if isinstance(value, dict):
        return {k: _reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(v) for v in value]
    return value


def test_digest_ignores_key_order() -> None:
    expected = digest(DOC)
    assert expected.startswith("sha256:") and len(expected) == len("sha256:") + 64
    for order in itertools.permutations(DOC):
        shuffled = {k: _reversed_keys(DOC[k]) for k in order}
        assert digest(shuffled) == expected
        assert canonical_json(shuffled) == canonical_json(DOC)


SAFE_INTS = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)  # RFC 8785's domain


@given(st.dictionaries(st.text(max_size=5), SAFE_INTS | st.text(max_size=5), max_size=6))
def test_digest_is_permutation_invariant(value: dict[str, Any]) -> None:
    assert digest(dict(reversed(list(value.items())))) == digest(value)


@pytest.mark.parametrize("value", [{"\ud800": 1}, {"a": {"\udfff": "x"}}, {"a": "\ud800"}])
def test_text_with_a_lone_surrogate_has_no_canonical_form(value: dict[str, Any]) -> None:
    """Found by the RPC fuzzer: a lone surrogate in a context key made
    rfc8785 raise UnicodeEncodeError, an INTERNAL error for the caller."""
    with pytest.raises(NotCanonicalizable):
        canonical_json(value)


def test_digest_changes_when_a_value_changes() -> None:
    changed = json.loads(json.dumps(DOC))
    changed["a"]["y"][2]["p"] = False
    assert digest(changed) != digest(DOC)
    assert digest({**DOC, "c": 1.25}) != digest(DOC)
    assert digest({**DOC, "b": "1"}) != digest(DOC)


def test_marks_anything_finds_a_marking_at_any_depth() -> None:
    from warden.shared.schema import SENSITIVE, marks_anything

    nested = {"$defs": {"card": {"anyOf": [{"type": "string", SENSITIVE: True}]}}}
    assert marks_anything(nested, SENSITIVE)
    plain = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert not marks_anything(plain, SENSITIVE)


@pytest.mark.parametrize(
    ("marking", "value"),
    [("x-warden-sensitive", 1), ("x-warden-model-visible", 0), ("x-warden-sensitive", "yes")],
)
def test_si5_a_marking_that_is_not_a_boolean_is_refused(marking: str, value: object) -> None:
    """1 is true to Python and not to TypeScript: one SDK would redact what
    the other shows, so the schema is refused where it is registered."""
    schema = {"type": "object", "properties": {"card": {"type": "string", marking: value}}}
    with pytest.raises(InvalidSchemaError, match=f"{marking} at /properties/card must be true"):
        compile_validator(schema)
