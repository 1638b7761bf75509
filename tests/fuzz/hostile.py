"""Hypothesis strategies for what an attacker sends: odd JSON, deep nesting,
huge numbers, forged tokens, globs and durations at the edges of their
grammars.

Each strategy mixes well-formed values (so the fuzzer reaches the deep
stages of the pipeline) with the hostile shapes that once broke the plane.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# Words of Python and of its libraries that must never reach a caller.
INTERNAL_WORDS = (
    "Traceback",
    "set_int_max_str_digits",
    "Not enough segments",
    "maximum recursion depth",
    "object at 0x",
    "RecursionError",
    "KeyError",
    "TypeError",
    "AttributeError",
    "UnicodeDecodeError",
    "Exception deserializing",
    "Exception calling application",
    "Exception iterating",
)

# Shapes that broke the plane once (the hardening issue) or break JSON
# parsers in general; kept as fixed members so every run tries them.
DEEP = 10_000
HOSTILE_JSON = [
    "[" * DEEP + "]" * DEEP,
    '{"a":' * DEEP + "1" + "}" * DEEP,
    "1e400",
    "-1e400",
    "1" * 5_000,
    '{"amount": ' + "9" * 5_000 + "}",
    '"\\ud800"',
    '{"\\ud800": 1}',
    "NaN",
    "Infinity",
    '{"a": NaN}',
    '{"a": 1, "a": 2}',
    "\ufeff{}",
    "",
    " ",
    "null",
    "{",
    '{"order_id": "' + "x" * 100_000 + '"}',
    "\x00",
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def json_text(*plausible: dict[str, Any]) -> st.SearchStrategy[str]:
    """JSON text for a ``*_json`` field: plausible documents, random JSON,
    hostile shapes and plain garbage."""
    return st.one_of(
        st.sampled_from([json.dumps(p) for p in plausible] or ["{}"]),
        json_values.map(json.dumps),
        st.sampled_from(HOSTILE_JSON),
        st.text(max_size=40),
    )


HOSTILE_TEXT = [
    "",
    " ",
    "\U0010ffff*",
    "\U0010ffff" * 300,
    "*" * 500,
    "a" * 300,
    "../../etc/passwd",
    "orders.*",
    "**",
    "[",
    "\x00",
    "%s%n",
    "' OR 1=1 --",
    "9999999d",
    "-1s",
    "1" * 30 + "s",
    "10" + "0" * 22,
    "2026-13-45",
    "9999-12-31T23:59:59Z",
    "0001-01-01",
]

texts = st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(max_size=60))

capability_ids = st.one_of(
    st.sampled_from(["orders.get", "orders.refund", "orders.export", "billing.charge"]),
    texts,
)

durations = st.one_of(
    st.sampled_from(["90s", "15m", "1h", "7d", "2026-01-02", "2026-01-02T03:04:05Z"]),
    st.integers(min_value=0, max_value=10**30).map(lambda n: f"{n}d"),
    texts,
)

page_tokens = st.one_of(
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
    texts,
)

uint32 = st.integers(min_value=0, max_value=2**32 - 1)


def sendable(value: str) -> bool:
    """Whether gRPC lets a client send the value as metadata (printable ASCII;
    anything else is refused by the client library before it leaves)."""
    return value.isascii() and value.isprintable()


header_values = st.one_of(
    st.sampled_from([v for v in HOSTILE_TEXT if sendable(v)]),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=200),
)
