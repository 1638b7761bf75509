"""SI-5 redaction over arbitrary nested JSON and schemas (hypothesis).

A value and its schema are generated together, each subschema randomly marked
sensitive and/or model-hidden and reached through properties, pattern or
additional properties, prefix or uniform items, ``$ref``/``$defs`` and
``allOf``/``anyOf``; the expected redaction is built alongside, so the
property is exact: the redacted copy equals it, and no sensitive value survives.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from warden.shared.redaction import Redaction, scrub_json, scrub_text, sensitive_texts
from warden.shared.schema import MODEL_VISIBLE, REDACTED, SENSITIVE, redact, strip_model_hidden

HIDDEN = object()

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
any_json = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=25,
)
secret_strings = st.uuids().map(lambda u: f"secret-{u.hex}")


@dataclass
class Node:
    value: Any
    schema: dict[str, Any]
    masked: Any
    """The expected ``redact`` result."""
    visible: Any
    """The expected ``strip_model_hidden`` result (``HIDDEN`` when dropped)."""
    secrets: list[str] = field(default_factory=list)


@dataclass
class Defs:
    schemas: dict[str, Any] = field(default_factory=dict)

    def ref(self, schema: dict[str, Any]) -> dict[str, Any]:
        name = f"d{len(self.schemas)}"
        self.schemas[name] = schema
        return {"$ref": f"#/$defs/{name}"}


@st.composite
def nodes(draw: st.DrawFn, defs: Defs, depth: int = 0, sensitive_above: bool = False) -> Node:
    sensitive = draw(st.integers(0, 3)) == 0
    hidden = draw(st.integers(0, 4)) == 0
    secret = sensitive or sensitive_above
    kinds = ["leaf", "object", "array", "tuple"] if depth < 3 else ["leaf"]
    kind = draw(st.sampled_from(kinds))
    if kind == "leaf":
        value = draw(secret_strings) if secret else draw(scalars)
        node = Node(value, {}, value, value, [value] if secret else [])
    elif kind == "object":
        keys = draw(st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=4))
        children = {k: draw(nodes(defs, depth + 1, secret)) for k in keys}
        route = draw(st.sampled_from(["properties", "patternProperties", "additional"]))
        if route == "properties":
            schema: dict[str, Any] = {
                "type": "object",
                "properties": {k: c.schema for k, c in children.items()},
            }
        elif route == "patternProperties":
            schema = {
                "type": "object",
                "patternProperties": {f"^{k}$": c.schema for k, c in children.items()},
            }
        else:
            # One schema for every extra key: only one child may be generated.
            children = dict(list(children.items())[:1])
            only = next(iter(children.values()), None)
            schema = {"type": "object", "additionalProperties": only.schema if only else {}}
        node = Node(
            {k: c.value for k, c in children.items()},
            schema,
            {k: c.masked for k, c in children.items()},
            {k: c.visible for k, c in children.items() if c.visible is not HIDDEN},
            [s for c in children.values() for s in c.secrets],
        )
    elif kind == "tuple":
        children_list = draw(st.lists(nodes(defs, depth + 1, secret), max_size=3))
        node = Node(
            [c.value for c in children_list],
            {"type": "array", "prefixItems": [c.schema for c in children_list]},
            [c.masked for c in children_list],
            [None if c.visible is HIDDEN else c.visible for c in children_list],
            [s for c in children_list for s in c.secrets],
        )
    else:
        child = draw(nodes(defs, depth + 1, secret))
        node = Node(
            [child.value],
            {"type": "array", "items": child.schema},
            [child.masked],
            [None if child.visible is HIDDEN else child.visible],
            child.secrets,
        )
    if sensitive:
        node.schema[SENSITIVE] = True
        node.masked = REDACTED
    if hidden:
        node.schema[MODEL_VISIBLE] = False
        node.visible = HIDDEN
    wrap = draw(st.sampled_from(["none", "ref", "allOf", "anyOf"]))
    if wrap == "ref":
        node.schema = defs.ref(node.schema)
    elif wrap == "allOf":
        node.schema = {"allOf": [node.schema]}
    elif wrap == "anyOf":
        node.schema = {"anyOf": [node.schema, {"type": "null"}]}
    return node


@st.composite
def documents(draw: st.DrawFn) -> tuple[Node, dict[str, Any]]:
    defs = Defs()
    node = draw(nodes(defs))
    root = dict(node.schema)
    if defs.schemas:
        # A $ref at the root keeps its own subschema: wrap it so $defs sits beside it.
        root = {"allOf": [node.schema], "$defs": defs.schemas}
    return node, root


@settings(max_examples=300, deadline=None)
@given(documents())
def test_si5_redaction_masks_exactly_the_marked_values(
    document: tuple[Node, dict[str, Any]],
) -> None:
    node, schema = document
    redacted = redact(node.value, schema)
    assert redacted == node.masked
    text = json.dumps(redacted)
    for secret in node.secrets:
        assert secret not in text


@settings(max_examples=200, deadline=None)
@given(documents(), st.binary(min_size=16, max_size=32))
def test_si5_keyed_hashes_reveal_nothing_and_correlate(
    document: tuple[Node, dict[str, Any]], key: bytes
) -> None:
    node, schema = document
    hashed = Redaction(hash_key=key).value(node.value, schema)
    text = json.dumps(hashed)
    for secret in node.secrets:
        assert secret not in text
    assert Redaction(hash_key=key).value(node.value, schema) == hashed
    # Same shape as masking, with a hash where the mask would be.
    masked = redact(node.value, schema)

    def same_shape(a: Any, b: Any) -> None:
        if b == REDACTED and isinstance(a, str) and a.startswith("hmac-sha256:"):
            return
        if isinstance(b, dict):
            assert isinstance(a, dict) and a.keys() == b.keys()
            for k in b:
                same_shape(a[k], b[k])
        elif isinstance(b, list):
            assert isinstance(a, list) and len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                same_shape(x, y)
        else:
            assert a == b

    same_shape(hashed, masked)


@settings(max_examples=200, deadline=None)
@given(documents())
def test_si5_redaction_is_idempotent(document: tuple[Node, dict[str, Any]]) -> None:
    node, schema = document
    once = redact(node.value, schema)
    assert redact(once, schema) == once


@settings(max_examples=300, deadline=None)
@given(documents())
def test_model_hidden_fields_are_stripped_and_nothing_else(
    document: tuple[Node, dict[str, Any]],
) -> None:
    node, schema = document
    expected = None if node.visible is HIDDEN else node.visible
    assert strip_model_hidden(node.value, schema) == expected


@settings(max_examples=200, deadline=None)
@given(documents())
def test_si5_every_sensitive_string_is_known_for_scrubbing(
    document: tuple[Node, dict[str, Any]],
) -> None:
    node, schema = document
    texts = sensitive_texts(node.value, schema)
    for secret in node.secrets:
        assert secret in texts
        message = f"failed for {secret!r}: {json.dumps({'v': secret})}"
        assert secret not in scrub_text(message, texts)
        assert secret not in json.dumps(scrub_json({"why": message, "n": [secret]}, texts))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=3, max_size=8), max_size=4),
    st.lists(st.text(max_size=12), max_size=6),
)
def test_si5_scrubbed_text_holds_no_secret(secrets: list[str], fillers: list[str]) -> None:
    text = "".join(f"{f}{s}" for f, s in zip(fillers, secrets * 2, strict=False)) + "".join(secrets)
    scrubbed = scrub_text(text, secrets)
    for secret in secrets:
        assert secret not in scrubbed


@settings(max_examples=300, deadline=None)
@given(
    any_json,
    st.recursive(
        st.dictionaries(
            st.sampled_from(
                ["type", "properties", "items", "$ref", "allOf", SENSITIVE, MODEL_VISIBLE, "a"]
            ),
            scalars,
            max_size=3,
        ),
        lambda c: st.dictionaries(
            st.sampled_from(
                [
                    "properties",
                    "items",
                    "allOf",
                    "anyOf",
                    "additionalProperties",
                    "prefixItems",
                    "$defs",
                    "a",
                ]
            ),
            c | st.lists(c, max_size=2),
            max_size=3,
        ),
        max_leaves=12,
    ),
)
def test_no_schema_or_value_makes_redaction_crash(value: Any, schema: dict[str, Any]) -> None:
    redact(value, schema)
    strip_model_hidden(value, schema)
    sensitive_texts(value, schema)


def test_a_marker_deep_in_arrays_of_objects_is_masked() -> None:
    marker = uuid.uuid4().hex
    schema = {
        "type": "object",
        "properties": {
            "rows": {"type": "array", "items": {"$ref": "#/$defs/Row"}},
        },
        "$defs": {
            "Row": {
                "type": "object",
                "properties": {"pan": {"type": "string", SENSITIVE: True}, "n": {}},
            }
        },
    }
    value = {"rows": [{"pan": marker, "n": 1}, {"pan": marker + "x", "n": 2}]}
    assert redact(value, schema) == {"rows": [{"pan": REDACTED, "n": 1}, {"pan": REDACTED, "n": 2}]}
