"""``warden audit tail``: JSON lines after a sequence number, and with
``--follow`` a stream that rides out a plane restart without a gap or a
repeat."""

from __future__ import annotations

import json
import os
import queue
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import warden
from tests.conftest import ORDERS_TOKEN, ROOT, load_example, make_config
from tests.integration.test_outcome_restart import free_port
from warden_server.app import serve
from warden_server.auth.actors import mint_token
from warden_server.plane import Plane


def tail_process(target: str, token: str, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'server'}{os.pathsep}{ROOT / 'client'}",
        "WARDEN_TOKEN": token,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "warden_server.cli", "audit", "tail", "--target", target, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


class Lines:
    """The records a running tail printed, read on a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.rows: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        assert process.stdout is not None
        stdout = process.stdout
        threading.Thread(target=self._read, args=(stdout,), daemon=True).start()

    def _read(self, stdout: Any) -> None:
        for line in stdout:
            self.rows.put(json.loads(line))

    def until(self, seq: int, timeout_s: float = 60.0) -> None:
        """Read until a record at or past ``seq`` was printed."""
        deadline = time.monotonic() + timeout_s
        while not self.seen or self.seen[-1]["seq"] < seq:
            self.seen.append(self.rows.get(timeout=max(0.1, deadline - time.monotonic())))


def seqs(db: Path) -> list[int]:
    conn = sqlite3.connect(db)
    try:
        return [int(seq) for (seq,) in conn.execute("SELECT seq FROM audit_events ORDER BY seq")]
    finally:
        conn.close()


def test_audit_tail_follow_resumes_after_a_plane_restart_without_gaps_or_duplicates(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path)
    listen = f"127.0.0.1:{free_port()}"
    servers = [serve(Plane.from_config(config), listen)]
    auditor = mint_token(config, subject="ada", roles=("auditor:all",), ttl_seconds=600)
    actor = mint_token(config, subject="bot-7", roles=("support",), tenant="acme")
    example = load_example()
    rt = example.build_runtime(listen, ORDERS_TOKEN)
    process = tail_process(listen, auditor, "--after", "0", "--follow", "--interval", "0.2")
    try:
        rt.register()
        assert rt.invoke("orders.get", {"order_id": "A1"}, actor=actor).status == "succeeded"
        rt.flush(timeout_ms=10_000)
        lines = Lines(process)
        lines.until(seqs(config.store_path)[-1])

        servers[-1].stop(grace=0)
        assert process.stderr is not None
        while "retrying" not in process.stderr.readline():  # the tail finds the plane away
            assert process.poll() is None
        servers.append(serve(Plane.from_config(config), listen))
        assert rt.invoke("orders.get", {"order_id": "B2"}, actor=actor).status == "succeeded"
        rt.flush(timeout_ms=10_000)
        lines.until(seqs(config.store_path)[-1])
    finally:
        rt.close()
        process.terminate()
        process.communicate(timeout=30)
        for server in servers:
            server.stop(grace=0)
    printed = [row["seq"] for row in lines.seen]
    assert printed == sorted(set(printed))  # oldest first, never twice
    stored = [seq for seq in seqs(config.store_path) if seq <= printed[-1]]
    assert printed == stored  # every record, none skipped
    outcomes = [row for row in lines.seen if row["kind"] == "outcome"]
    assert len(outcomes) == 2


def test_audit_tail_after_prints_only_newer_records_of_the_auditors_tenant(
    plant: Any, orders: warden.Runtime
) -> None:
    acme = plant.token(sub="bot-7", roles=("support",), tenant="acme")
    globex = plant.token(sub="bot-9", roles=("support",), tenant="globex")
    assert orders.invoke("orders.get", {"order_id": "A1"}, actor=acme).status == "succeeded"
    assert orders.invoke("orders.get", {"order_id": "A1"}, actor=globex).status == "succeeded"
    plant.await_outcome_reports()
    auditor = plant.token(sub="ada", roles=("auditor",), tenant="acme")
    first = plant.events(kind="decision", tenant="acme")[0]["seq"]
    process = tail_process(plant.target, auditor, "--after", str(first))
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows and all(row["seq"] > first for row in rows)
    assert {row["tenant"] for row in rows} == {"acme"}
    assert [row["seq"] for row in rows] == sorted(row["seq"] for row in rows)


def test_audit_tail_after_a_seq_past_the_newest_says_so(plant: Any, orders: warden.Runtime) -> None:
    """A SEQ from another log, or mistyped, would skip every record up to it
    in silence: it is said once, on stderr."""
    acme = plant.token(sub="bot-7", roles=("support",), tenant="acme")
    assert orders.invoke("orders.get", {"order_id": "A1"}, actor=acme).status == "succeeded"
    auditor = plant.token(sub="ada", roles=("auditor",), tenant="acme")
    newest = max(row["seq"] for row in plant.events(tenant="acme"))
    process = tail_process(plant.target, auditor, "--after", "999999")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert out == ""
    said = re.search(r"--after 999999 is past the newest record it can read \(seq (\d+)\)", err)
    assert said is not None, err
    assert int(said.group(1)) >= newest  # the tail's own access record may be newer
