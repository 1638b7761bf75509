"""The durable queue of approval notifications, in the store's file.

Two tables: ``notification_cursor`` holds the sequence number of the last
approval record turned into notifications, and ``notifications`` holds one
row per (record, webhook) until it is delivered or given up. Turning records
into rows and moving the cursor happen in one transaction, so a plane that
stops at any point neither loses nor repeats a notification; a delivery cut
short is tried again after a restart.

Only the plane's first process delivers (like the approval sweeper), on a
connection of its own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

BUSY_TIMEOUT_MS = 10_000


def create_tables(db: sqlite_utils.Database) -> None:
    """The migration that adds the queue."""
    db.execute(
        "CREATE TABLE notification_cursor (id INTEGER PRIMARY KEY CHECK (id = 1), "
        "seq INTEGER NOT NULL)"
    )
    db.execute(
        "CREATE TABLE notifications ("
        " id INTEGER PRIMARY KEY,"
        " event_seq INTEGER NOT NULL,"
        " webhook TEXT NOT NULL,"
        " event TEXT NOT NULL,"
        " body TEXT NOT NULL,"
        " attempts INTEGER NOT NULL DEFAULT 0,"
        " next_at REAL NOT NULL,"
        " delivered_at REAL,"
        " gave_up_at REAL,"
        " last_error TEXT,"
        " UNIQUE (event_seq, webhook))"
    )
    db.execute(
        "CREATE INDEX notifications_due ON notifications (next_at) "
        "WHERE delivered_at IS NULL AND gave_up_at IS NULL"
    )


@dataclass(frozen=True, slots=True)
class Notification:
    id: int
    event_seq: int
    webhook: str
    event: str
    body: str
    attempts: int


@dataclass(frozen=True, slots=True)
class Pending:
    """One queued notification to write: for ``webhook``, ``body``."""

    webhook: str
    event: str
    body: str


class NotificationQueue:
    """The queue in the store at ``path``."""

    def __init__(self, path: Path) -> None:
        # Made by the plane, used by the notifier thread alone, closed after it ends.
        self._conn = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
        self._conn.row_factory = sqlite3.Row
        self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")

    def close(self) -> None:
        self._conn.close()

    def take_new_events(
        self,
        build: Callable[[dict[str, Any], dict[str, Any] | None], Iterable[Pending]],
        now: float,
        limit: int = 500,
    ) -> int:
        """Turn the approval records after the cursor into queued notifications
        (``build`` gives those of one record and its approval), and move the
        cursor past them. A first run starts at the log's head: no history is sent.

        Returns:
            How many records were taken.
        """
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT seq FROM notification_cursor WHERE id = 1").fetchone()
            if row is None:
                head = conn.execute("SELECT coalesce(max(seq), 0) FROM audit_events").fetchone()
                conn.execute("INSERT INTO notification_cursor (id, seq) VALUES (1, ?)", (head[0],))
                conn.execute("COMMIT")
                return 0
            events = [
                dict(r)
                for r in conn.execute(
                    "SELECT * FROM audit_events WHERE seq > ? AND kind = 'approval' "
                    "ORDER BY seq LIMIT ?",
                    (row[0], limit),
                )
            ]
            last = events[-1]["seq"] if len(events) == limit else None
            if last is None:
                last = conn.execute("SELECT coalesce(max(seq), 0) FROM audit_events").fetchone()[0]
            for event in events:
                approval = conn.execute(
                    "SELECT * FROM approvals WHERE approval_id = ?", (event["approval_id"],)
                ).fetchone()
                for pending in build(event, dict(approval) if approval else None):
                    conn.execute(
                        "INSERT OR IGNORE INTO notifications "
                        "(event_seq, webhook, event, body, next_at) VALUES (?, ?, ?, ?, ?)",
                        (event["seq"], pending.webhook, pending.event, pending.body, now),
                    )
            conn.execute("UPDATE notification_cursor SET seq = ? WHERE id = 1", (last,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return len(events)

    def due(self, now: float, limit: int = 100) -> list[Notification]:
        """Notifications to try now, oldest first."""
        rows = self._conn.execute(
            "SELECT id, event_seq, webhook, event, body, attempts FROM notifications "
            "WHERE delivered_at IS NULL AND gave_up_at IS NULL AND next_at <= ? "
            "ORDER BY next_at, id LIMIT ?",
            (now, limit),
        )
        return [Notification(**dict(r)) for r in rows]

    def next_due_at(self) -> float | None:
        row = self._conn.execute(
            "SELECT min(next_at) FROM notifications "
            "WHERE delivered_at IS NULL AND gave_up_at IS NULL"
        ).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def delivered(self, notification_id: int, now: float) -> None:
        self._conn.execute(
            "UPDATE notifications SET delivered_at = ?, attempts = attempts + 1, "
            "last_error = NULL WHERE id = ?",
            (now, notification_id),
        )

    def failed(self, notification_id: int, error: str, next_at: float | None, now: float) -> None:
        """A failed attempt: retry at ``next_at``, or give up when it is None."""
        if next_at is None:
            self._conn.execute(
                "UPDATE notifications SET attempts = attempts + 1, last_error = ?, "
                "gave_up_at = ? WHERE id = ?",
                (error, now, notification_id),
            )
        else:
            self._conn.execute(
                "UPDATE notifications SET attempts = attempts + 1, last_error = ?, "
                "next_at = ? WHERE id = ?",
                (error, next_at, notification_id),
            )
