"""Anchors catch what a hash chain alone cannot: its newest records cut off, or
the whole log rewritten into another valid chain."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from click.testing import CliRunner

import warden
from tests.conftest import Plant
from warden_server.audit.chain import GENESIS, record_hash
from warden_server.cli import main


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def populate(rt: warden.Runtime, plant: Plant) -> Path:
    for n in range(3):
        assert rt.invoke("orders.echo", {"n": n}, actor=plant.token()).status == "succeeded"
    assert rt.flush(timeout_ms=10_000) == 0
    return plant.db_path


def test_head_prints_an_anchor_that_verify_accepts(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    db = str(populate(lab_rt, lab_plant))
    code, anchor, _ = run("audit", "head", "--store", db)
    newest = lab_plant.rows("SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1")[0]
    assert code == 0 and anchor.strip() == f"{newest['seq']}:{newest['hash']}"
    code, out, _ = run("audit", "verify", "--store", db, "--anchor", anchor.strip())
    assert code == 0 and "1 anchors hold" in out


def test_a_log_cut_short_passes_the_chain_but_not_the_anchor(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    db = populate(lab_rt, lab_plant)
    _, anchor, _ = run("audit", "head", "--store", str(db))
    conn = sqlite3.connect(db)
    conn.execute("DELETE FROM audit_events WHERE seq > (SELECT max(seq) - 2 FROM audit_events)")
    conn.commit()
    conn.close()
    assert run("audit", "verify", "--store", str(db))[0] == 0, "the shorter chain is valid"
    code, _, err = run("audit", "verify", "--store", str(db), "--anchor", anchor.strip())
    assert code == 1 and "is gone" in err and "cut off" in err


def test_a_rewritten_log_passes_the_chain_but_not_the_anchor(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    db = populate(lab_rt, lab_plant)
    _, anchor, _ = run("audit", "head", "--store", str(db))
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT * FROM audit_events ORDER BY seq")]
    previous = GENESIS
    for row in rows:  # edit one record, then re-hash everything after it
        if row["seq"] == 2:
            row["actor_id"] = "someone-else"
        row["prev_hash"] = previous
        row["hash"] = previous = record_hash(row)
        conn.execute(
            "UPDATE audit_events SET actor_id = ?, prev_hash = ?, hash = ? WHERE seq = ?",
            (row["actor_id"], row["prev_hash"], row["hash"], row["seq"]),
        )
    conn.commit()
    conn.close()
    assert run("audit", "verify", "--store", str(db))[0] == 0, "the rewritten chain is valid"
    code, _, err = run("audit", "verify", "--store", str(db), "--anchor", anchor.strip())
    assert code == 1 and "another hash" in err and "rewritten" in err


def test_an_anchor_must_be_seq_colon_hash(lab_rt: warden.Runtime, lab_plant: Plant) -> None:
    db = str(populate(lab_rt, lab_plant))
    code, _, err = run("audit", "verify", "--store", db, "--anchor", "12:not-a-hash")
    assert code == 2 and "SEQ:HASH" in err
