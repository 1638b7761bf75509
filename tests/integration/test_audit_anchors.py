"""Anchors catch what a hash chain alone cannot: its newest records cut off, or
the whole log rewritten into another valid chain."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import warden
from tests.conftest import ORDERS_TOKEN, Plant, make_config
from tests.integration.lab import Lab, build_lab, write_lab_policies
from warden_server.app import serve
from warden_server.cli import main
from warden_server.plane import Plane
from warden_server.records.chain import GENESIS, record_hash


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def populate(rt: warden.Runtime, plant: Plant) -> Path:
    for n in range(3):
        assert rt.invoke("orders.echo", {"n": n}, actor=plant.token()).status == "succeeded"
    assert rt.flush(timeout_ms=10_000) == 0
    return plant.db_path


def at_rest(plant: Plant) -> Path:
    """The store once its plane has stopped: what someone who edits the file
    edits, with no record appended behind their back."""
    plant.server.stop()
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
    anchored = int(anchor.split(":")[0])
    conn = sqlite3.connect(at_rest(lab_plant))
    conn.execute("DELETE FROM audit_events WHERE seq > ?", (anchored - 2,))
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
    conn = sqlite3.connect(at_rest(lab_plant))
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
    # Not verified (3): a usage mistake is no verdict on the log, and click's
    # own 2 would read as "the store file is damaged".
    assert code == 3 and "SEQ:HASH" in err


def test_a_log_cut_short_verifies_only_with_a_plain_word_on_what_is_not_proven(
    lab_rt: warden.Runtime, lab_plant: Plant
) -> None:
    db = populate(lab_rt, lab_plant)
    conn = sqlite3.connect(db)
    conn.execute("DELETE FROM audit_events WHERE seq > (SELECT max(seq) - 2 FROM audit_events)")
    conn.commit()
    conn.close()
    code, out, err = run("audit", "verify", "--store", str(db))
    assert code == 0 and out.startswith("ok: ")
    assert err.startswith("not proven without an anchor: that no records were cut off the end")


def test_the_plane_publishes_signed_anchors_that_catch_a_log_cut_short(
    tmp_path: Path,
) -> None:
    key = tmp_path / "checkpoint.pem"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    config = make_config(tmp_path, write_lab_policies(tmp_path / "lab"))
    config = config.model_copy(
        update={
            "audit": config.audit.model_copy(
                update={"checkpoint_key_file": str(key), "anchor_interval": "1h"}
            )
        }
    )
    with serve(Plane.from_config(config), "127.0.0.1:0") as server:
        plant = Plant(server, tmp_path)
        rt = build_lab(plant.target, ORDERS_TOKEN, Lab())
        rt.register()
        populate(rt, plant)
        rt.close()
        server.stop()  # a plane that stops publishes its head last
    published = config.anchors_path.read_text().splitlines()
    newest = plant.rows("SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1")[0]
    last = json.loads(published[-1])
    assert (last["seq"], last["hash"]) == (newest["seq"], newest["hash"])
    assert last["signature"] and last["key_id"]
    verify = ("audit", "verify", "--store", str(plant.db_path), "--public-key", str(key))
    code, out, err = run(*verify, "--anchors", str(config.anchors_path))
    assert code == 0 and "1 anchors hold" in out and not err

    forged = {**last, "seq": last["seq"] - 1}
    config.anchors_path.write_text("\n".join([*published, json.dumps(forged)]) + "\n")
    conn = sqlite3.connect(plant.db_path)
    conn.execute("DELETE FROM audit_events WHERE seq > (SELECT max(seq) - 2 FROM audit_events)")
    conn.commit()
    conn.close()
    code, _, err = run(*verify, "--anchors", str(config.anchors_path))
    assert code == 1 and "is gone" in err and "cut off" in err, err

    # Without the key its signatures cannot be checked: a line forged without
    # it would count, so the check is refused rather than trusted.
    unkeyed = ("audit", "verify", "--config", "absent.toml", "--store", str(plant.db_path))
    code, out, err = run(*unkeyed, "--anchors", str(config.anchors_path))
    assert code == 3 and "ok:" not in out, out
    assert "the anchors are signed, and there is no checkpoint key" in err
    assert f"{config.anchors_path}:1:" in err
