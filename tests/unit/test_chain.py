"""verify_rows names the record that is not as written, for each kind of tampering."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warden.shared.canonical import NotCanonicalizable, canonical_json, compact_json
from warden_server.audit.chain import verify_rows
from warden_server.records.chain import GENESIS, canonical_row, record_hash
from warden_server.records.events import new_event_id


def chain(n: int, start_seq: int = 1, prev: str = GENESIS) -> list[dict[str, Any]]:
    rows = []
    for seq in range(start_seq, start_seq + n):
        row: dict[str, Any] = {"seq": seq, "status": f"s{seq}", "prev_hash": prev}
        row["hash"] = record_hash(row)
        prev = row["hash"]
        rows.append(row)
    return rows


def rehash(row: dict[str, Any]) -> dict[str, Any]:
    row["hash"] = record_hash(row)
    return row


def test_an_intact_chain_verifies_and_counts() -> None:
    result = verify_rows(chain(5))
    assert (result.ok, result.checked, result.first_bad_seq) == (True, 5, None)


def test_a_chain_continues_from_a_checkpoint() -> None:
    head = chain(10)
    tail = head[6:]
    assert verify_rows(tail, head[5]["hash"], 7).ok
    assert verify_rows(tail, GENESIS, 7).first_bad_seq == 7
    assert verify_rows(tail).first_bad_seq == 1


def edit(rows: list[dict[str, Any]]) -> None:
    rows[3]["status"] = "x"


def edit_and_rehash(rows: list[dict[str, Any]]) -> None:
    rows[3]["status"] = "x"
    rehash(rows[3])


def delete(rows: list[dict[str, Any]]) -> None:
    del rows[3]


@pytest.mark.parametrize(
    ("tamper", "bad", "words"),
    [(edit, 4, "edited"), (edit_and_rehash, 4, "re-hashed"), (delete, 4, "missing")],
)
def test_each_tampering_is_named(tamper: Any, bad: int, words: str) -> None:
    rows = chain(8)
    tamper(rows)
    result = verify_rows(rows)
    assert not result.ok and result.first_bad_seq == bad
    assert words in (result.problem or "")
    assert result.checked == bad - 1


def test_an_insertion_with_renumbering_names_the_inserted_record() -> None:
    rows = chain(8)
    forged = rehash({"seq": 5, "status": "forged", "prev_hash": rows[3]["hash"]})
    for row in rows[4:]:
        row["seq"] += 1
    rows.insert(4, forged)
    result = verify_rows(rows)
    assert result.first_bad_seq == 5 and "inserted at seq 5" in (result.problem or "")


def test_a_deletion_with_renumbering_names_the_gap() -> None:
    rows = chain(8)
    del rows[4]
    for row in rows[4:]:
        row["seq"] -= 1
    result = verify_rows(rows)
    assert result.first_bad_seq == 5 and "written as seq 6" in (result.problem or "")


def test_swapped_records_are_named_at_the_first() -> None:
    rows = chain(8)
    rows[5]["seq"], rows[6]["seq"] = 7, 6
    rows.sort(key=lambda r: r["seq"])
    assert verify_rows(rows).first_bad_seq == 6


# -- the fast canonical form of a row is exactly RFC 8785 ------------------------------

values = st.one_of(
    st.none(),
    st.text(),
    st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1),
    st.integers(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
)


@settings(max_examples=150)
@given(st.dictionaries(st.text(max_size=12), values, max_size=12))
def test_the_canonical_row_is_byte_for_byte_rfc8785(row: dict[str, Any]) -> None:
    try:
        expected = canonical_json(row)
    except Exception:  # e.g. an integer outside the JSON-safe range
        with pytest.raises(Exception):  # noqa: B017
            canonical_row(row)
        return
    assert canonical_row(row) == expected


def test_a_stored_row_takes_the_fast_path_and_matches() -> None:
    row = {"seq": 7, "status": 'said "héllo"\n\u2028\x00', "input": None, "prev_hash": GENESIS}
    assert canonical_row(row) == canonical_json(row)


json_values = st.recursive(
    values,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300)
@given(json_values)
def test_canonical_json_is_byte_for_byte_rfc8785_at_any_depth(value: Any) -> None:
    import rfc8785

    try:
        expected = bytes(rfc8785.dumps(value))
    except Exception:  # no canonical form: ours refuses too
        with pytest.raises(NotCanonicalizable):
            canonical_json(value)
        return
    assert canonical_json(value) == expected


def test_the_fast_path_writes_escapes_and_unicode_as_rfc8785() -> None:
    import rfc8785

    value = {"a": ['tab\t "q" \\ \x00 \x1f \x7f é \u2028 \U0001f600', True, None, -(2**53) + 1]}
    assert canonical_json(value) == bytes(rfc8785.dumps(value))


@settings(max_examples=300)
@given(json_values)
def test_compact_json_is_byte_for_byte_json_dumps(value: Any) -> None:
    """Stored and wire JSON keeps json.dumps's form whichever encoder writes it."""
    assert compact_json(value) == json.dumps(
        value, separators=(",", ":"), sort_keys=True, ensure_ascii=False
    )


def test_text_with_a_lone_surrogate_is_stored_as_json_dumps_writes_it() -> None:
    value = {"a": "broken \ud800 text", "b": [1, None]}
    assert compact_json(value) == '{"a":"broken \ud800 text","b":[1,null]}'
    with pytest.raises(NotCanonicalizable):
        canonical_json(value)


def test_record_ids_are_uuid7_and_grow_with_time() -> None:
    """Ids are appended at the end of their unique index, not at random places."""
    first = new_event_id()
    time.sleep(0.002)
    later = [new_event_id() for _ in range(100)]
    assert len(set(later)) == 100
    for text in (first, *later):
        parsed = uuid.UUID(hex=text)
        assert (parsed.version, parsed.variant, len(text)) == (7, uuid.RFC_4122, 32)
    assert all(first < text for text in later)
    assert abs(int(first[:12], 16) - time.time() * 1000) < 60_000
