"""The outbox file of a service, opened by several of its processes at once."""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
import threading
from pathlib import Path

import warden
from warden._outbox import _Report, _ReportFile


def test_processes_opening_one_outbox_take_turns(tmp_path: Path) -> None:
    """Turning a fresh file to WAL while another process opens it can fail at
    once with "database is locked": an opener waits for the one before it."""
    path = tmp_path / "outbox.sqlite"
    other = os.open(f"{path}.open-lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(other, fcntl.LOCK_EX)  # another process is opening the file
    opened = threading.Event()
    files: list[_ReportFile] = []

    def open_file() -> None:
        files.append(_ReportFile(path, "127.0.0.1:50051"))
        opened.set()

    opener = threading.Thread(target=open_file)
    opener.start()
    try:
        assert not opened.wait(0.3), "opened while another process was opening the file"
    finally:
        fcntl.flock(other, fcntl.LOCK_UN)
        os.close(other)
    assert opened.wait(10)
    opener.join()
    (opened_file,) = files
    try:
        assert opened_file.adopt() == []
    finally:
        opened_file.close()


def test_a_send_started_while_the_outbox_closes_is_dropped_not_left_pending(
    tmp_path: Path,
) -> None:
    """A timer can start a send while the outbox shuts down; the loop stops
    before it would run, and a task left pending at the loop's close is
    destroyed unawaited. Once closing has begun, no new work starts (its
    reports stay in the file)."""
    rt = warden.Runtime(
        "127.0.0.1:9", service="orders", token="t", outbox=tmp_path / "outbox.sqlite"
    )
    outbox = rt._outbox
    try:
        asyncio.run_coroutine_threadsafe(outbox._shutdown(), outbox._loop).result(timeout=10)
        late = asyncio.sleep(3600)
        outbox._loop.call_soon_threadsafe(outbox._spawn, late)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), outbox._loop).result(timeout=10)
        assert late.cr_frame is None, "the late send was neither run nor closed"
        assert not outbox._tasks
    finally:
        rt.close()


EARLIER_FORMAT = (
    "CREATE TABLE reports ("
    " invocation_id TEXT PRIMARY KEY, target TEXT NOT NULL, request BLOB NOT NULL,"
    " trace TEXT NOT NULL, written_at REAL NOT NULL, owner TEXT NOT NULL, refusal TEXT)",
    "CREATE INDEX reports_by_owner ON reports (owner)",
    "CREATE TABLE owners ("
    " owner TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, seen_at REAL NOT NULL)",
)
"""An outbox as SDK releases before the current file format wrote it."""


def test_an_outbox_written_in_the_earlier_format_keeps_its_reports(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        for statement in EARLIER_FORMAT:
            conn.execute(statement)
        conn.executemany(
            "INSERT INTO reports VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    "inv-1",
                    "127.0.0.1:50051",
                    b"one",
                    '[["traceparent", "00-a-b-01"]]',
                    1.0,
                    "gone/1/a",
                    None,
                ),
                ("inv-2", "127.0.0.1:50051", b"two", "[]", 2.0, "gone/1/a", "NOT_FOUND"),
                ("inv-3", "elsewhere:50051", b"three", "[]", 3.0, "gone/1/a", None),
            ],
        )
    conn.close()

    opened = _ReportFile(path, "127.0.0.1:50051")
    try:
        taken = sorted(opened.adopt(), key=lambda report: report.invocation_id)
    finally:
        opened.close()

    assert taken == [
        _Report("inv-1", b"one", (("traceparent", "00-a-b-01"),)),
        _Report("inv-2", b"two", ()),
    ]
    assert_in_the_current_format(path)
    with sqlite3.connect(path) as conn:
        assert conn.execute(
            "SELECT invocation_id, request, owner FROM reports ORDER BY invocation_id"
        ).fetchall() == [
            ("inv-1", b"one", opened.owner),
            ("inv-2", b"two", opened.owner),
            ("inv-3", b"three", "gone/1/a"),  # another plane's, left for it
        ]
    conn.close()


def test_a_new_outbox_keeps_its_reports_in_one_b_tree(tmp_path: Path) -> None:
    """A report is written before its caller gets the envelope: into the
    invocation id's own b-tree, with no rowid table and no index beside it."""
    path = tmp_path / "outbox.sqlite"
    _ReportFile(path, "127.0.0.1:50051").close()
    assert_in_the_current_format(path)


def assert_in_the_current_format(path: Path) -> None:
    """Reports in the invocation id's own b-tree, with no index beside it."""
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (1,)
        (reports,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'reports'").fetchone()
        assert reports.endswith("WITHOUT ROWID")
        indexes = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'reports'"
        assert conn.execute(indexes).fetchall() == []
    conn.close()
