"""``warden audit`` on the store file: every filter, paging, every stats grouping,
export, and verify naming each kind of tampering, before and after retention."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.integration import auditlog
from warden_server.audit.chain import verify_rows
from warden_server.cli import main
from warden_server.records.chain import record_hash
from warden_server.records.events import COLUMNS

# `warden audit` reads a store file; no plane here takes its process count
# from WARDEN_TEST_PROCESSES, so these run once whatever counts it lists.
pytestmark = pytest.mark.fixed_processes

NO_CONFIG = "no-such-config.toml"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return auditlog.seeded_store(tmp_path / "audit.db")


def ed25519_pem(path: Path) -> Path:
    """A fresh private key, as ``openssl genpkey -algorithm ed25519`` writes it."""
    path.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


@pytest.fixture
def key(tmp_path: Path) -> Path:
    return ed25519_pem(tmp_path / "checkpoint.pem")


def warden(*args: str, ok: bool = True) -> Result:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def audit(db: Path, command: str, *args: str, ok: bool = True) -> Result:
    return warden("audit", command, "--config", NO_CONFIG, "--store", str(db), *args, ok=ok)


def query_seqs(db: Path, *args: str) -> list[int]:
    lines = audit(db, "query", "--json", "--limit", "1000", *args).stdout.splitlines()
    return [json.loads(line)["seq"] for line in lines]


def tamper(db: Path, *statements: str) -> None:
    conn = sqlite3.connect(db)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def rows(db: Path, sql: str = "SELECT * FROM audit_events ORDER BY seq") -> list[dict[str, Any]]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql)]
    finally:
        conn.close()


# -- query: each filter --------------------------------------------------------

FILTERS = [
    (["--actor", "alice"], lambda r: r["actor_id"] == "alice"),
    (["--tenant", "globex"], lambda r: r["tenant"] == "globex"),
    (["--stage", "policy"], lambda r: r["stage"] == "policy"),
    (["--code", "POLICY_DENIED"], lambda r: r["code"] == "POLICY_DENIED"),
    (["--status", "granted"], lambda r: r["status"] == "granted"),
    (["--kind", "outcome"], lambda r: r["kind"] == "outcome"),
    (["--invocation", "i-05"], lambda r: r["invocation_id"] == "i-05"),
    (["--capability", "orders.refund"], auditlog.glob("orders.refund")),
    (["--capability", "orders.*"], auditlog.glob("orders.*")),
    (["--capability", "*.refund"], auditlog.glob("*.refund")),
    (["--capability", "billing.?efund"], auditlog.glob("billing.?efund")),
    (
        ["--capability", "orders.get", "--capability", "billing.*"],
        lambda r: auditlog.glob("orders.get")(r) or auditlog.glob("billing.*")(r),
    ),
    (["--since", auditlog.ts(10)], lambda r: r["ts"] >= auditlog.ts(10)),
    (["--until", auditlog.ts(4)], lambda r: r["ts"] < auditlog.ts(4)),
    (
        ["--since", "2026-03-01T00:20:00Z", "--until", "2026-03-01T00:40:00+00:00"],
        lambda r: auditlog.ts(4) <= r["ts"] < auditlog.ts(8),
    ),
    (["--since", "2026-03-01"], lambda r: True),
    (
        ["--kind", "decision", "--tenant", "acme", "--stage", "policy"],
        lambda r: r["kind"] == "decision" and r["tenant"] == "acme" and r["stage"] == "policy",
    ),
]


@pytest.mark.parametrize(
    ("args", "keep"), FILTERS, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_each_filter_selects_exactly_its_records_newest_first(
    db: Path, args: list[str], keep: Any
) -> None:
    expected = auditlog.expected_seqs(keep)
    assert expected, "the filter should select something"
    assert query_seqs(db, *args) == expected


def test_a_relative_since_counts_back_from_now(db: Path) -> None:
    assert query_seqs(db, "--since", "1h") == []
    assert len(query_seqs(db, "--since", "100000d")) == len(auditlog.LOG)


@pytest.mark.parametrize(
    ("command", "option"),
    [("query", "--since"), ("stats", "--until"), ("export", "--since"), ("prune", "--before")],
)
def test_an_unreadable_time_is_a_usage_error_naming_its_option(
    db: Path, command: str, option: str
) -> None:
    result = audit(db, command, option, "yesterday-ish", ok=False)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert "'yesterday-ish' is neither an ISO 8601 time" in result.output


@pytest.mark.parametrize("command", ["query", "stats", "export"])
def test_a_since_not_before_until_is_refused_not_an_empty_answer(db: Path, command: str) -> None:
    result = audit(db, command, "--since", "1h", "--until", "2h", ok=False)
    assert result.exit_code == 1, result.output
    assert "since '1h'" in result.output and "is not before until '2h'" in result.output
    same = audit(db, command, "--since", "2026-01-02", "--until", "2026-01-02T00:00:00Z", ok=False)
    assert "is not before until" in same.output


def test_json_lines_carry_every_column(db: Path) -> None:
    line = audit(db, "query", "--json", "--limit", "1").stdout.splitlines()
    assert len(line) == 1
    assert tuple(json.loads(line[0])) == COLUMNS


def test_the_table_shows_the_newest_records_first(db: Path) -> None:
    out = audit(db, "query", "--limit", "3").stdout.splitlines()
    assert out[0].split()[:4] == ["seq", "ts", "kind", "status"]
    assert [line.split()[0] for line in out[1:]] == ["18", "17", "16"]


def test_paging_walks_every_record_once_newest_first(db: Path) -> None:
    seen: list[int] = []
    before: list[str] = []
    for _ in range(10):
        result = audit(db, "query", "--json", "--limit", "5", *before)
        seen += [json.loads(line)["seq"] for line in result.stdout.splitlines()]
        if "more: --before" not in result.stderr:
            break
        before = ["--before", result.stderr.split("--before")[1].strip()]
    assert seen == list(range(len(auditlog.LOG), 0, -1))


def test_paging_keeps_the_filter(db: Path) -> None:
    first = audit(db, "query", "--json", "--limit", "2", "--tenant", "acme")
    cursor = first.stderr.split("--before")[1].strip()
    rest = query_seqs(db, "--tenant", "acme", "--before", cursor)
    pages = [json.loads(line)["seq"] for line in first.stdout.splitlines()] + rest
    assert pages == auditlog.expected_seqs(lambda r: r["tenant"] == "acme")


@pytest.mark.parametrize("past", [1, 1000, 2**62])
def test_before_past_the_newest_record_reads_from_the_newest(db: Path, past: int) -> None:
    newest = len(auditlog.LOG)
    assert query_seqs(db, "--before", str(newest + past)) == list(range(newest, 0, -1))
    assert query_seqs(db, "--before", str(newest + past), "--tenant", "acme") == (
        auditlog.expected_seqs(lambda r: r["tenant"] == "acme")
    )


def test_before_a_pruned_record_reads_what_is_older_and_the_help_says_older(
    db: Path, key: Path
) -> None:
    prune(db, key, auditlog.ts(10))  # records 1-10 are gone
    assert query_seqs(db, "--before", "5") == []
    assert query_seqs(db, "--before", "12") == [11]
    shown = " ".join(audit(db, "query", "--help").stdout.split())
    assert "--before SEQ Only records older than record SEQ" in shown


def test_a_common_glob_pages_along_the_time_index_with_the_same_answer(db: Path) -> None:
    # With two records a page, orders.* matches past the crossover (2 * 18 < 7 ** 2):
    # pages are read newest first along the time index instead of the capability index.
    seen: list[int] = []
    before: list[str] = []
    for _ in range(20):
        result = audit(db, "query", "--json", "--limit", "2", "--capability", "orders.*", *before)
        seen += [json.loads(line)["seq"] for line in result.stdout.splitlines()]
        if "more: --before" not in result.stderr:
            break
        before = ["--before", result.stderr.split("--before")[1].strip()]
    assert seen == auditlog.expected_seqs(auditlog.glob("orders.*"))


# -- stats: each grouping ------------------------------------------------------------


@pytest.mark.parametrize(
    ("by", "column"),
    [
        ("stage", "stage"),
        ("code", "code"),
        ("capability", "capability_id"),
        ("actor", "actor_id"),
        ("status", "status"),
    ],
)
def test_stats_count_every_group(db: Path, by: str, column: str) -> None:
    lines = audit(db, "stats", "--by", by, "--json").stdout.splitlines()
    got = {json.loads(line)[by]: json.loads(line)["count"] for line in lines}
    expected: dict[str | None, int] = {}
    for row in rows(db):
        expected[row[column]] = expected.get(row[column], 0) + 1
    assert got == expected
    counts = [json.loads(line)["count"] for line in lines]
    assert counts == sorted(counts, reverse=True)
    assert sum(json.loads(line)["share"] for line in lines) == pytest.approx(1.0)


def test_stats_rates_are_per_minute_over_the_window(db: Path) -> None:
    since, until = auditlog.ts(0), auditlog.ts(10)  # a 50 minute window
    lines = audit(
        db, "stats", "--by", "stage", "--since", since, "--until", until, "--json"
    ).stdout.splitlines()
    stats = {json.loads(line)["stage"]: json.loads(line) for line in lines}
    assert stats["policy"]["count"] == 1
    assert stats["policy"]["per_minute"] == pytest.approx(1 / 50)
    assert sum(s["count"] for s in stats.values()) == 10


def test_stats_without_since_rate_over_the_span_of_the_records(db: Path) -> None:
    out = audit(db, "stats", "--by", "code", "--kind", "decision").stdout
    span_minutes = (len(auditlog.LOG) - 1) * 5 - 10  # first decision at index 2, last at 17
    assert f"over {span_minutes:.1f} min" in out.splitlines()[0]
    policy = next(line for line in out.splitlines() if line.startswith("POLICY_DENIED"))
    decisions = sum(1 for entry in auditlog.LOG if entry[0] == "decision")
    assert policy.split()[1:3] == ["3", f"{3 / decisions * 100:.1f}%"]
    assert float(policy.split()[3]) == pytest.approx(3 / span_minutes, abs=0.005)


def test_stats_group_by_stage_unless_told(db: Path) -> None:
    assert audit(db, "stats").stdout == audit(db, "stats", "--by", "stage").stdout
    assert audit(db, "stats").stdout.splitlines()[0].endswith("by stage")


def test_stats_print_one_table_per_grouping_asked_for(db: Path) -> None:
    both = audit(db, "stats", "--by", "stage", "--by", "code").stdout
    stage, code = (audit(db, "stats", "--by", by).stdout for by in ("stage", "code"))
    assert both == stage + "\n" + code
    lines = audit(db, "stats", "--by", "code", "--by", "actor", "--json").stdout.splitlines()
    keys = [next(iter(json.loads(line))) for line in lines]
    assert keys == sorted(keys, key=["code", "actor"].index) and set(keys) == {"code", "actor"}


def test_an_unknown_stage_and_two_sources_are_usage_errors(db: Path) -> None:
    """A typo in --stage would read as "no records"; --store beside --target
    would leave one of them unread in silence."""
    typo = audit(db, "query", "--stage", "polcy", ok=False)
    assert typo.exit_code == 2 and "'polcy' is not one of 'discovery'" in typo.output
    both = audit(db, "query", "--target", "127.0.0.1:50051", "--token", "t", ok=False)
    assert both.exit_code == 2
    assert "give --store (read the file) or --target" in both.output


def test_stats_refuse_an_unknown_grouping(db: Path) -> None:
    result = audit(db, "stats", "--by", "mood", ok=False)
    assert result.exit_code == 2 and "mood" in result.output


# -- export ----------------------------------------------------------------------------


def test_export_writes_matching_records_oldest_first_and_they_verify(db: Path) -> None:
    every = [json.loads(line) for line in audit(db, "export").stdout.splitlines()]
    assert [r["seq"] for r in every] == list(range(1, len(auditlog.LOG) + 1))
    assert verify_rows(every).ok
    since = audit(db, "export", "--since", auditlog.ts(15)).stdout.splitlines()
    assert [json.loads(line)["seq"] for line in since] == [16, 17, 18]
    first = json.loads(since[0])
    assert verify_rows([json.loads(line) for line in since], first["prev_hash"], 16).ok


# -- verify: each kind of tampering (SI-4) -------------------------------------------------


def verify_fails_at(db: Path, seq: int, *args: str) -> str:
    result = audit(db, "verify", *args, ok=False)
    assert result.exit_code == 1, result.output
    assert f"TAMPERED at seq {seq}:" in result.stderr, result.stderr
    return result.stderr


def test_si4_an_intact_log_verifies(db: Path) -> None:
    assert audit(db, "verify").stdout.strip() == f"ok: {len(auditlog.LOG)} records, chain intact"


def test_si4_verify_names_an_edited_record(db: Path) -> None:
    tamper(db, "UPDATE audit_events SET status = 'granted' WHERE seq = 5")
    assert "edited" in verify_fails_at(db, 5)


def test_si4_verify_names_an_edited_and_rehashed_record(db: Path) -> None:
    row = rows(db, "SELECT * FROM audit_events WHERE seq = 7")[0]
    row["actor_id"] = "mallory"
    tamper(
        db,
        f"UPDATE audit_events SET actor_id = 'mallory', hash = '{record_hash(row)}' WHERE seq = 7",
    )
    assert "re-hashed" in verify_fails_at(db, 7)


def test_si4_verify_names_a_deleted_record(db: Path) -> None:
    tamper(db, "DELETE FROM audit_events WHERE seq = 9")
    assert "records 9..9 are missing" in verify_fails_at(db, 9)


def test_si4_verify_names_a_deletion_hidden_by_renumbering(db: Path) -> None:
    tamper(
        db,
        "DELETE FROM audit_events WHERE seq = 9",
        "UPDATE audit_events SET seq = seq - 1 WHERE seq > 9",
    )
    assert "written as seq 10" in verify_fails_at(db, 9)


def test_si4_verify_names_an_inserted_record(db: Path) -> None:
    # A forged record linked properly to seq 5, later records moved up to make room.
    tamper(db, "UPDATE audit_events SET seq = seq + 1000 WHERE seq > 5")
    tamper(db, "UPDATE audit_events SET seq = seq - 999 WHERE seq > 1000")
    previous = rows(db, "SELECT * FROM audit_events WHERE seq = 5")[0]
    forged = {column: None for column in COLUMNS}
    forged.update(
        seq=6,
        event_id="forged",
        ts=auditlog.ts(5),
        kind="decision",
        status="granted",
        actor_id="mallory",
        prev_hash=previous["hash"],
    )
    forged["hash"] = record_hash(forged)
    conn = sqlite3.connect(db)
    try:
        conn.execute(
            f"INSERT INTO audit_events ({', '.join(COLUMNS)}) "
            f"VALUES ({', '.join(':' + c for c in COLUMNS)})",
            forged,
        )
        conn.commit()
    finally:
        conn.close()
    assert "inserted at seq 6" in verify_fails_at(db, 6)


def test_si4_verify_names_reordered_records(db: Path) -> None:
    tamper(
        db,
        "UPDATE audit_events SET seq = -1 WHERE seq = 11",
        "UPDATE audit_events SET seq = 11 WHERE seq = 12",
        "UPDATE audit_events SET seq = 12 WHERE seq = -1",
    )
    verify_fails_at(db, 11)


def test_si4_verify_names_records_missing_from_the_start(db: Path) -> None:
    tamper(db, "DELETE FROM audit_events WHERE seq <= 3")
    assert "records 1..3 are missing" in verify_fails_at(db, 1)


# -- retention (prune with a signed checkpoint) ---------------------------------------------


def prune(db: Path, key: Path, before: str) -> Result:
    return warden(
        "audit", "prune", "--config", NO_CONFIG, "--store", str(db), "--before", before,
        "--key", str(key),
    )  # fmt: skip


def test_prune_deletes_old_records_and_leaves_a_signed_checkpoint(db: Path, key: Path) -> None:
    out = prune(db, key, auditlog.ts(10)).stdout
    assert "pruned 10 records through seq 10" in out
    remaining = rows(db)
    assert [r["seq"] for r in remaining] == list(range(11, len(auditlog.LOG) + 2))
    retention = remaining[-1]
    assert retention["kind"] == "retention" and retention["status"] == "pruned"
    assert json.loads(retention["details"])["through_seq"] == 10
    (checkpoint,) = rows(db, "SELECT * FROM audit_checkpoints")
    assert checkpoint["seq"] == 10 and checkpoint["records"] == 10
    assert checkpoint["pruned_before"] == auditlog.ts(10)
    verified = audit(db, "verify", "--public-key", str(key)).stdout
    assert f"ok: {len(auditlog.LOG) - 10 + 1} records from seq 11" in verified


def test_an_anchor_retention_pruned_is_not_counted_as_holding(db: Path, key: Path) -> None:
    (second,) = rows(db, "SELECT seq, hash FROM audit_events WHERE seq = 2")
    prune(db, key, auditlog.ts(10))
    anchor = f"{second['seq']}:{second['hash']}"
    done = audit(db, "verify", "--public-key", str(key), "--anchor", anchor)
    assert "anchors hold" not in done.stdout
    assert done.stdout.rstrip().endswith("chain intact (1 pruned, not checked)")
    assert "anchor 2: pruned by retention, not checked" in done.stderr
    assert "not proven without an anchor" in done.stderr


def test_prune_with_nothing_old_enough_changes_nothing(db: Path, key: Path) -> None:
    assert "nothing older than" in prune(db, key, "2020-01-01").stdout
    assert len(rows(db)) == len(auditlog.LOG)


def test_prune_refuses_a_time_in_the_future(db: Path, key: Path) -> None:
    """--before 2099-01-01 would erase the whole log, the newest record too:
    refused, and nothing deleted."""
    result = warden(
        "audit", "prune", "--config", NO_CONFIG, "--store", str(db), "--before", "2099-01-01",
        "--key", str(key), ok=False,
    )  # fmt: skip
    assert result.exit_code == 1
    assert "before '2099-01-01' is in the future: it would prune every record" in result.output
    assert len(rows(db)) == len(auditlog.LOG)


def test_prune_in_chunks_keeps_one_checkpoint_and_the_chain(db: Path, key: Path) -> None:
    from datetime import UTC, datetime

    from warden_server.audit.checkpoint import CheckpointSigner
    from warden_server.audit.retention import prune as prune_store
    from warden_server.store import SQLiteStore

    store = SQLiteStore(db)
    try:
        result = prune_store(
            store,
            CheckpointSigner.from_private_file(key),
            before=auditlog.ts(9),
            now=datetime.now(UTC),
            chunk=4,
        )
    finally:
        store.close()
    assert (result.records, result.through_seq) == (9, 9)
    assert [r["seq"] for r in rows(db, "SELECT seq FROM audit_checkpoints")] == [9]
    assert [r["reason"] for r in rows(db) if r["kind"] == "retention"] == [
        "pruned 4 records through seq 4",
        "pruned 4 records through seq 8",
        "pruned 1 records through seq 9",
    ]
    audit(db, "verify", "--public-key", str(key))


@pytest.mark.parametrize("when", ["before its read", "after its read, before its commit"])
def test_two_prunes_at_once_count_each_record_once_and_refuse_nothing(
    db: Path, key: Path, when: str
) -> None:
    """The plane's retention and an operator's prune may run together: each
    goes on from the checkpoint the other left, no record is counted in two
    retention records, and neither takes the other's deletions for tampering."""
    from collections.abc import Iterator
    from datetime import UTC, datetime

    from warden_server.audit.checkpoint import CheckpointSigner
    from warden_server.audit.retention import prune as prune_store
    from warden_server.records.query import RecordFilter
    from warden_server.store import SQLiteStore

    signer = CheckpointSigner.from_private_file(key)
    first, other = SQLiteStore(db), SQLiteStore(db)
    reads = first.audit_records
    raced = []

    def read_then_race(selection: RecordFilter, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if not raced and when == "before its read":
            raced.append(prune_store(other, signer, before=auditlog.ts(6), now=datetime.now(UTC)))
        found = list(reads(selection, *args, **kwargs))
        if not raced:
            raced.append(prune_store(other, signer, before=auditlog.ts(6), now=datetime.now(UTC)))
        return iter(found)

    first.audit_records = read_then_race  # type: ignore[method-assign]
    try:
        result = prune_store(first, signer, before=auditlog.ts(9), now=datetime.now(UTC), chunk=4)
    finally:
        first.close()
        other.close()
    assert (raced[0].records, raced[0].through_seq) == (6, 6)
    assert (result.records, result.through_seq) == (3, 9)
    assert [r["reason"] for r in rows(db) if r["kind"] == "retention"] == [
        "pruned 6 records through seq 6",
        "pruned 3 records through seq 9",
    ]
    assert [r["records"] for r in rows(db, "SELECT records FROM audit_checkpoints")] == [3]
    audit(db, "verify", "--public-key", str(key))


def test_prune_refuses_to_erase_tampered_records(db: Path, key: Path) -> None:
    tamper(db, "UPDATE audit_events SET status = 'granted' WHERE seq = 4")
    result = warden(
        "audit", "prune", "--config", NO_CONFIG, "--store", str(db), "--before",
        auditlog.ts(10), "--key", str(key), ok=False,
    )  # fmt: skip
    assert result.exit_code == 1
    assert "refusing to prune: seq 4 does not verify" in result.output
    assert len(rows(db)) == len(auditlog.LOG)


def test_si4_after_retention_verify_still_names_an_edited_record(db: Path, key: Path) -> None:
    prune(db, key, auditlog.ts(10))
    tamper(db, "UPDATE audit_events SET actor_id = 'mallory' WHERE seq = 14")
    verify_fails_at(db, 14, "--public-key", str(key))


def test_si4_after_retention_verify_names_a_deleted_first_record(db: Path, key: Path) -> None:
    prune(db, key, auditlog.ts(10))
    tamper(db, "DELETE FROM audit_events WHERE seq = 11")
    verify_fails_at(db, 11, "--public-key", str(key))


def test_si4_after_retention_a_forged_checkpoint_is_named(db: Path, key: Path) -> None:
    prune(db, key, auditlog.ts(10))
    # Hiding more deletions needs a checkpoint further on: the signature gives it away.
    nxt = rows(db, "SELECT hash FROM audit_events WHERE seq = 12")[0]["hash"]
    tamper(
        db,
        "DELETE FROM audit_events WHERE seq IN (11, 12)",
        f"UPDATE audit_checkpoints SET seq = 12, hash = '{nxt}'",
    )
    assert "not signed by key" in verify_fails_at(db, 12, "--public-key", str(key))


def test_si4_after_retention_a_deleted_checkpoint_shows_the_gap(db: Path, key: Path) -> None:
    prune(db, key, auditlog.ts(10))
    tamper(db, "DELETE FROM audit_checkpoints")
    assert "records 1..10 are missing" in verify_fails_at(db, 1, "--public-key", str(key))


def test_after_retention_verify_without_the_key_says_what_it_needs(db: Path, key: Path) -> None:
    prune(db, key, auditlog.ts(10))
    result = audit(db, "verify", ok=False)
    assert result.exit_code == 3  # not verified: neither tampered (1) nor damaged (2)
    assert "pruned through seq 10" in result.output and "checkpoint_key_file" in result.output


def test_after_retention_another_key_fails_verification(
    db: Path, key: Path, tmp_path: Path
) -> None:
    prune(db, key, auditlog.ts(10))
    other = ed25519_pem(tmp_path / "other.pem")
    verify_fails_at(db, 10, "--public-key", str(other))


def test_pruning_everything_leaves_its_own_record_and_the_chain_goes_on(
    db: Path, key: Path
) -> None:
    from warden_server.records.events import AuditEvent
    from warden_server.store import SQLiteStore

    prune(db, key, "0s")  # everything older than now: the whole log
    (left,) = rows(db)
    assert left["kind"] == "retention" and left["seq"] == len(auditlog.LOG) + 1
    store = SQLiteStore(db)  # as after a restart
    try:
        seq = store.transact(lambda tx: tx.append_audit(AuditEvent(kind="policy", status="ok")))
    finally:
        store.close()
    assert seq == len(auditlog.LOG) + 2
    audit(db, "verify", "--public-key", str(key))


def test_the_public_key_alone_verifies_but_cannot_prune(
    db: Path, key: Path, tmp_path: Path
) -> None:
    prune(db, key, auditlog.ts(10))
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    public = tmp_path / "checkpoint.pub.pem"
    public.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    assert audit(db, "verify", "--public-key", str(public)).stdout.startswith("ok: ")
    refused = warden(
        "audit", "prune", "--config", NO_CONFIG, "--store", str(db), "--before", "2100-01-01",
        "--key", str(public), ok=False,
    )  # fmt: skip
    assert refused.exit_code == 1 and "needs the private key" in refused.output


def test_store_reads_no_warden_toml_it_was_not_given(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warden.toml lying in the current folder is not read beside --store:
    a broken one would stop the command, a working one lend its key unasked."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "warden.toml").write_text("[server\nthis is not TOML\n")
    monkeypatch.chdir(folder)
    for command in (["query", "--limit", "1"], ["verify"], ["head"]):
        result = CliRunner().invoke(main, ["audit", *command, "--store", str(db)])
        assert result.exit_code == 0, (command, result.output)
    given = CliRunner().invoke(
        main, ["audit", "head", "--store", str(db), "--config", "warden.toml"]
    )
    assert given.exit_code == 1 and "warden.toml" in given.output
