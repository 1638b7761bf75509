"""The outbox: outcome reports kept until the plane takes them.

Once a handler has run, losing its outcome would leave the audit log a
decision without an ending and an idempotency key in doubt. So an attempt
writes its report (the ``CompleteRequest``) to the outbox before the caller
gets the envelope, and the caller does not wait for the plane: a thread of the
runtime's own sends the report, and while the plane is away it tries again,
with growing pauses, for as long as it takes. A report waits a moment
(``REPORT_DELAY_S``) for the reports of the next calls, so that they reach the
plane together, in one call and one commit. Sending a report twice is
harmless: the plane answers a report it took before with the record it made.

The outbox is a small SQLite file per service (or memory, when turned off).
Every process of the service may share it. Each process sends the reports it
wrote and says every few seconds that it lives. The reports of a process that
ended, or stopped saying so, are taken over by another process or by the next
run. Reports for another plane (another ``target``) wait for a runtime that
talks to it. A report the plane refused (it did not know the invocation, or
the grant) stays in the file with the plane's answer and is tried once more
by the next run.

Writes are not flushed to the disk one by one (``synchronous=NORMAL``): a
report outlives the process being killed, not the machine losing power.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import random
import re
import socket
import sqlite3
import threading
import time
import weakref
from collections import deque
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from warden._errors import CapabilityError, WardenError
from warden._tracing import trace_metadata
from warden._transport import PlaneRefusedError, ReportTransport
from warden.v1 import governor_pb2

log = logging.getLogger("warden")

HEARTBEAT_S: Final = 5.0
"""How often a process says it lives; three missed beats and its reports are taken over."""
REPORT_DELAY_S: Final = 0.05
"""How long a report waits for others to go with it. Sent at once, each report
costs the plane a call and a commit of its own, made beside the runtime's next
``Begin`` (which then waits for both); gathered, the reports of the calls made
meanwhile go in one ``CompleteMany`` call and one commit. A full call's worth
goes at once, and everything goes at once when someone waits for it
(``flush``, a call repeating an idempotency key, closing)."""
CALLS_AT_ONCE: Final = 4
"""``CompleteMany`` calls in flight to the plane at one time. While they are,
the reports that come due wait and go together in the next call: a report is
sent at once when the plane keeps up, and in ever larger calls (each committed
by the plane in one transaction) when it does not."""
REPORTS_PER_CALL: Final = 256
"""Reports in one ``CompleteMany`` call at most (what the plane takes in one call)."""
BYTES_PER_CALL: Final = 512 * 1024
"""The size of one call's reports at most (a larger report goes alone)."""
SENDING_AT_ONCE: Final = 64
"""Reports in flight at one time to a plane without ``CompleteMany``, one per call."""
BACKLOG_LIMIT: Final = 2_048
"""Reports this process may hold that the plane has not taken; past it a new
call waits for room (``Outbox.room``), so a plane that falls behind slows its
callers instead of letting reports pile up without end."""
AWAY_PAUSES_S: Final = (0.1, 2.0)
"""The first and the longest pause while the plane does not answer."""
REFUSED_PAUSES_S: Final = (1.0, 60.0)
"""The first and the longest pause before retrying a report the plane failed on."""
EXIT_GRACE_S: Final = 2.0
"""How long a process that ends without closing its runtime waits for the
plane to take the reports it holds (those it does not take stay in the file)."""

_AWAY: Final = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"})
"""The plane did not answer: every report waits."""
_REFUSED: Final = frozenset(
    {
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "FAILED_PRECONDITION",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
    }
)
"""The plane answered that it will not take this report: trying again now changes nothing."""

_REPORTS: Final = (
    "CREATE TABLE {name} ("
    " invocation_id TEXT PRIMARY KEY, target TEXT NOT NULL, request BLOB NOT NULL,"
    " trace TEXT NOT NULL, written_at REAL NOT NULL, owner TEXT NOT NULL, refusal TEXT)"
    " WITHOUT ROWID"
)
"""The reports, each a row of the invocation id's own b-tree: writing one
updates one b-tree, not three (a rowid table, its key's index and an index by
owner, which the take-over's ``owner != ?`` scanned past anyway)."""
_OWNERS: Final = (
    "CREATE TABLE IF NOT EXISTS owners ("
    " owner TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, seen_at REAL NOT NULL)"
)
_FORMAT: Final = 1
"""``PRAGMA user_version`` of a file in the current format. 0: reports in a
rowid table with an index by owner (SDK releases before it), moved over on open."""

IdempotencyScope = tuple[str, str]
"""A capability id and an idempotency key."""
Trace = tuple[tuple[str, str], ...]
"""The trace context of the invocation a report ends, as gRPC metadata."""


@dataclass(frozen=True, slots=True)
class _Report:
    invocation_id: str
    request: bytes
    trace: Trace


def default_outbox_path(service: str) -> Path:
    """A service's outbox under the user's state folder (XDG Base Directory)."""
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", service)
    return Path(state) / "warden" / f"outbox-{name}.sqlite"


class _ReportFile:
    """The reports on disk (or in memory), for one process and one plane."""

    def __init__(self, path: Path | None, target: str) -> None:
        self.path = path
        self.target = target
        self.host = socket.gethostname()
        self.owner = f"{self.host}/{os.getpid()}/{os.urandom(6).hex()}"
        self._lock = threading.Lock()
        if path is None:
            self._open(":memory:")
            return
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))  # SQLite keeps the mode
        # Processes of a service starting together open the file one at a time:
        # turning a fresh file to WAL while another process opens it can fail at
        # once with "database is locked", whatever the busy timeout. The lock is
        # a file of its own: closing any descriptor of the database file would
        # drop the locks SQLite holds on it.
        turns = os.open(f"{path}.open-lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(turns, fcntl.LOCK_EX)
            self._open(str(path))
        finally:
            os.close(turns)

    def _open(self, where: str) -> None:
        self._conn = sqlite3.connect(
            where, isolation_level=None, check_same_thread=False, timeout=10
        )
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA secure_delete=ON")  # taken reports leave no trace
            self._upgrade()
        self.heartbeat()  # before the first report: another process must not take it over

    def _upgrade(self) -> None:
        """Bring the file to ``_FORMAT``, keeping every report (one transaction;
        openers take turns, so one process does it)."""
        if self._conn.execute("PRAGMA user_version").fetchone()[0] >= _FORMAT:
            return
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._conn.execute(_OWNERS)
            old = self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'reports'"
            ).fetchone()
            if old is None:
                self._conn.execute(_REPORTS.format(name="reports"))
            else:
                self._conn.execute(_REPORTS.format(name="reports_new"))
                self._conn.execute(
                    "INSERT INTO reports_new (invocation_id, target, request, trace, written_at,"
                    " owner, refusal) SELECT invocation_id, target, request, trace, written_at,"
                    " owner, refusal FROM reports"
                )
                self._conn.execute("DROP TABLE reports")  # and its index by owner
                self._conn.execute("ALTER TABLE reports_new RENAME TO reports")
            self._conn.execute(f"PRAGMA user_version = {_FORMAT}")
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise

    def put(self, report: _Report) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO reports (invocation_id, target, request, trace, "
                "written_at, owner) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    report.invocation_id,
                    self.target,
                    report.request,
                    json.dumps(report.trace),
                    time.time(),
                    self.owner,
                ),
            )

    def delete(self, invocation_ids: list[str]) -> None:
        """Forget taken reports, in one transaction: a statement outside one is
        a transaction of its own, and its write to the log (about 25 µs here,
        against 4 µs for a row of a batch)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(
                    "DELETE FROM reports WHERE invocation_id = ?", [(i,) for i in invocation_ids]
                )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def refuse(self, invocation_id: str, answer: str) -> None:
        with self._lock:
            self._conn.execute(
                "UPDATE reports SET refusal = ? WHERE invocation_id = ?", (answer, invocation_id)
            )

    def heartbeat(self) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO owners (owner, host, pid, seen_at) VALUES (?, ?, ?, ?)",
                (self.owner, self.host, os.getpid(), time.time()),
            )

    def adopt(self) -> list[_Report]:
        """Take over this plane's reports whose writer is gone; returns them."""
        stale_before = time.time() - 3 * HEARTBEAT_S
        with self._lock:
            owners = self._conn.execute(
                "SELECT owner, host, pid, seen_at FROM owners WHERE owner != ?", (self.owner,)
            ).fetchall()
            gone = [
                owner
                for owner, host, pid, seen_at in owners
                if seen_at < stale_before or (host == self.host and not _alive(pid))
            ]
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany("DELETE FROM owners WHERE owner = ?", [(o,) for o in gone])
                rows = self._conn.execute(
                    "UPDATE reports SET owner = ?, refusal = NULL WHERE target = ? AND owner != ? "
                    "AND owner NOT IN (SELECT owner FROM owners) "
                    "RETURNING invocation_id, request, trace",
                    (self.owner, self.target, self.owner),
                ).fetchall()
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return [
            _Report(str(i), bytes(r), tuple((k, v) for k, v in json.loads(t))) for i, r, t in rows
        ]

    def close(self) -> None:
        """Leave this process's reports to whoever runs next, and close."""
        with self._lock:
            self._conn.execute("DELETE FROM owners WHERE owner = ?", (self.owner,))
            self._conn.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


class Outbox:
    """Outcome reports waiting for the plane, and the thread that sends them.

    Args:
        transport: How to reach the plane.
        path: The outbox file; None keeps reports in memory only.
        backlog_limit: Reports held, not yet taken, past which new calls wait.
    """

    def __init__(
        self, transport: ReportTransport, path: Path | None, backlog_limit: int = BACKLOG_LIMIT
    ) -> None:
        self._transport = transport
        self.backlog_limit = backlog_limit
        try:
            self._file = _ReportFile(path, transport.target)
        except (OSError, sqlite3.Error) as exc:
            raise WardenError(f"the outbox {path} cannot be opened: {exc}") from None
        self.path = path
        self._lock = threading.Lock()
        self._waiting: dict[str, concurrent.futures.Future[None]] = {}
        """Reports this process sent or will send, until the plane takes them."""
        self._by_scope: dict[IdempotencyScope, concurrent.futures.Future[None]] = {}
        self._incoming: list[_Report] = []
        """Reports submitted since the loop last looked (under ``_lock``)."""
        self._woken = False
        """The loop will look at ``_incoming`` (a report's wait is running):
        further reports need not wake it (under ``_lock``)."""
        self._closed = False
        # Everything below belongs to the outbox's own event loop.
        self._loop = asyncio.new_event_loop()
        self._due: deque[_Report] = deque()
        self._ripe = False
        """The due reports have waited long enough: send them as calls allow."""
        self._delay: asyncio.TimerHandle | None = None
        self._sending = 0
        """Calls in flight."""
        self._away_pause = AWAY_PAUSES_S[0]
        self._resume_at = 0.0
        self._probing = False
        self._one_by_one = False
        """The plane does not know CompleteMany (an older plane): report by report."""
        self._failures: dict[str, int] = {}
        self._taken: list[str] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._shutting_down = False
        """Set on the loop once closing has begun: no new work starts."""
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="warden-outbox", daemon=True
        )
        self._thread.start()
        _OPEN.add(self)
        self._take_over()  # what an earlier run left, before this one sends anything
        self._loop.call_soon_threadsafe(self._spawn, self._keep_alive())

    # -- the callers' side -------------------------------------------------

    def submit(
        self, request: governor_pb2.CompleteRequest, scope: IdempotencyScope | None = None
    ) -> None:
        """Keep a report until the plane takes it (written before this returns)."""
        invocation_id = request.invocation_id
        report = _Report(invocation_id, request.SerializeToString(), trace_metadata())
        taken = self._hold(invocation_id)
        with self._lock:
            if scope is not None:
                self._by_scope[scope] = taken
                taken.add_done_callback(lambda _: self._forget(scope, taken))
        try:
            self._file.put(report)
        except sqlite3.Error as exc:
            log.warning(
                "the outcome of invocation %s is kept in memory only: the outbox %s "
                "cannot be written (%s)",
                invocation_id,
                self.path,
                exc,
            )
        # The report waits for company anyway: only the first of a wait (or a
        # full call's worth) wakes the loop, not every report, each a wake of
        # another thread beside the caller's.
        with self._lock:
            closed = self._closed
            if not closed:
                self._incoming.append(report)
                wake = not self._woken or len(self._incoming) >= REPORTS_PER_CALL
                self._woken = True
        if closed:
            log.warning(
                "the outcome of invocation %s was reported after the runtime was closed; "
                "it is left %s",
                invocation_id,
                f"in {self.path} for the next run" if self.path else "unsent",
            )
        elif wake:
            self._loop.call_soon_threadsafe(self._collect)

    @property
    def backlog(self) -> int:
        """Reports held that the plane has not taken yet."""
        with self._lock:
            return len(self._waiting)

    async def room(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the backlog is below
        ``backlog_limit``; whether it is."""
        for pause in self._pauses_for_room(timeout_s):
            await asyncio.sleep(pause)
        return self.backlog < self.backlog_limit

    def room_blocking(self, timeout_s: float) -> bool:
        """``room``, for a thread that blocks while it waits."""
        for pause in self._pauses_for_room(timeout_s):
            time.sleep(pause)
        return self.backlog < self.backlog_limit

    def _pauses_for_room(self, timeout_s: float) -> Iterator[float]:
        """The pauses to wait while the backlog is full, until ``timeout_s`` has passed."""
        deadline = time.monotonic() + timeout_s
        pause = 0.001
        while self.backlog >= self.backlog_limit and time.monotonic() < deadline:
            yield pause
            pause = min(pause * 2, 0.05)

    async def reported(self, scope: IdempotencyScope, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until the plane has taken the report of
        this process's last call with this idempotency key, if one is waiting."""
        with self._lock:
            taken = self._by_scope.get(scope)
        if taken is not None:
            self._hurry()
            await asyncio.wait([asyncio.wrap_future(taken)], timeout=timeout_s)

    def reported_blocking(self, scope: IdempotencyScope, timeout_s: float) -> None:
        """``reported``, for a thread that blocks while it waits."""
        with self._lock:
            taken = self._by_scope.get(scope)
        if taken is not None:
            self._hurry()
            concurrent.futures.wait([taken], timeout=timeout_s)

    def flush(self, timeout_s: float | None = None) -> int:
        """Wait until the plane has taken every report this process holds, or
        ``timeout_s`` has passed; returns how many still wait."""
        with self._lock:
            waiting = list(self._waiting.values())
        if waiting:
            self._hurry()
        _, left = concurrent.futures.wait(waiting, timeout=timeout_s)
        return len(left)

    def close(self, grace_s: float) -> int:
        """Send what can be sent within ``grace_s``, then stop; returns how many
        reports are left in the outbox for the next run."""
        _OPEN.discard(self)
        left = self.flush(grace_s)
        with self._lock:
            self._closed = True  # what comes now stays in the file
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            self._file.close()
        if left:
            where = f"in {self.path}" if self.path else "in memory, and are lost"
            log.warning("%d outcome reports the plane has not taken are left %s", left, where)
        return left

    def _hurry(self) -> None:
        """Send every due report now (someone waits for one)."""
        with contextlib.suppress(RuntimeError):  # a closed loop sends nothing any more
            self._loop.call_soon_threadsafe(self._send_now)

    def _hold(self, invocation_id: str) -> concurrent.futures.Future[None]:
        """A report to wait for: settled when the plane takes (or refuses) it."""
        taken: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            self._waiting[invocation_id] = taken
        return taken

    def _take_over(self) -> None:
        """Send the reports of this service and plane whose writer is gone."""
        try:
            leftovers = self._file.adopt()
        except sqlite3.Error as exc:
            log.warning("the outbox %s cannot be read (%s)", self.path, exc)
            return
        if leftovers:
            log.info("sending %d outcome reports an earlier run left", len(leftovers))
        for report in leftovers:
            self._hold(report.invocation_id)
            self._loop.call_soon_threadsafe(self._enqueue, report)

    def _forget(self, scope: IdempotencyScope, taken: concurrent.futures.Future[None]) -> None:
        with self._lock:
            if self._by_scope.get(scope) is taken:
                del self._by_scope[scope]

    # -- the outbox's own loop ---------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        if self._shutting_down:
            # A send a timer started while the outbox closes: the loop stops
            # before it would run. Its reports stay in the file for the next run.
            work.close()
            return
        task = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _enqueue(self, report: _Report) -> None:
        self._due.append(report)
        self._wait_for_company()
        self._pump()

    def _collect(self) -> None:
        """Take in the submitted reports; they wait their moment for company.
        The wait ends in ``_send_now``; the first report after it wakes the loop again."""
        self._take_incoming()
        self._wait_for_company()
        self._pump()

    def _wait_for_company(self) -> None:
        if self._delay is None:
            self._delay = self._loop.call_later(REPORT_DELAY_S, self._send_now)

    def _take_incoming(self, *, ending_wait: bool = False) -> None:
        with self._lock:
            self._due.extend(self._incoming)
            self._incoming.clear()
            if ending_wait:
                self._woken = False

    def _send_now(self) -> None:
        """The due reports have waited enough (or someone waits for them)."""
        if self._delay is not None:
            self._delay.cancel()
            self._delay = None
        self._take_incoming(ending_wait=True)
        self._ripe = True
        self._pump()

    def _pump(self) -> None:
        """Start sending what is due once it has waited its moment or fills a
        call, unless the plane is away: then one report at a time probes
        whether it is back."""
        if self._loop.time() < self._resume_at:
            return
        self._take_incoming()
        if not self._ripe and len(self._due) < REPORTS_PER_CALL:
            return
        limit = SENDING_AT_ONCE if self._one_by_one else CALLS_AT_ONCE
        if self._probing:
            limit = 1
        while self._due and self._sending < limit:
            self._sending += 1
            self._spawn(self._send(self._next_batch(), many=not self._one_by_one))
        if not self._due:
            self._ripe = False

    def _next_batch(self) -> list[_Report]:
        """The due reports for one call: up to ``REPORTS_PER_CALL`` of them and
        ``BYTES_PER_CALL`` bytes (one to a plane without CompleteMany, or while
        probing whether the plane is back)."""
        most = 1 if self._one_by_one or self._probing else REPORTS_PER_CALL
        batch = [self._due.popleft()]
        size = len(batch[0].request)
        while self._due and len(batch) < most:
            size += len(self._due[0].request)
            if size > BYTES_PER_CALL:
                break
            batch.append(self._due.popleft())
        return batch

    async def _send(self, batch: list[_Report], *, many: bool) -> None:
        try:
            answers = await self._answers(batch, many=many)
        except CapabilityError as error:  # the call as a whole
            cause = error.cause
            code = cause.code if isinstance(cause, PlaneRefusedError) else "UNKNOWN"
            if many and code == "UNIMPLEMENTED":
                self._one_by_one = True  # an older plane: it still takes Complete
                self._due.extendleft(reversed(batch))
                self._ripe = True  # they have waited their moment already
            else:
                answers = [(code, str(cause))] * len(batch)
                self._settle_answers(batch, answers)
        else:
            self._settle_answers(batch, answers)
        finally:
            self._sending -= 1
        self._pump()

    async def _answers(self, batch: list[_Report], *, many: bool) -> list[tuple[str, str] | None]:
        """Send ``batch`` (in one CompleteMany call, or its one report by
        Complete); the plane's answer to each report: None when it took it,
        else the status code's name and what it said.

        Raises:
            CapabilityError: the call failed as a whole.
        """
        if not many:
            (report,) = batch
            request = governor_pb2.CompleteRequest.FromString(report.request)
            await self._transport.complete(request, report.trace)
            return [None]
        response = await self._transport.complete_many(
            [
                governor_pb2.OutcomeReport(
                    request=governor_pb2.CompleteRequest.FromString(report.request),
                    trace_context=dict(report.trace),
                )
                for report in batch
            ]
        )
        if len(response.results) != len(batch):
            raise CapabilityError(
                "GOVERNANCE_UNAVAILABLE",
                cause=PlaneRefusedError(
                    "UNKNOWN",
                    f"answered {len(response.results)} results for {len(batch)} reports",
                    self._transport.target,
                ),
            )
        return [
            None
            if result.WhichOneof("result") == "audit_seq"
            else (
                result.refusal.code,
                f"{self._transport.target} answered {result.refusal.code}: "
                f"{result.refusal.message}",
            )
            for result in response.results
        ]

    def _settle_answers(self, batch: list[_Report], answers: list[tuple[str, str] | None]) -> None:
        away: list[_Report] = []
        for report, answer in zip(batch, answers, strict=True):
            if answer is None:
                self._took(report.invocation_id)
                continue
            code, said = answer
            if code in _AWAY:
                away.append(report)
            elif code in _REFUSED:
                self._refused(report.invocation_id, said)
            else:
                self._retry_later(report, said)
        if away:
            self._due.extendleft(reversed(away))  # first in line, in their order
            self._plane_away()

    def _plane_away(self) -> None:
        if self._loop.time() < self._resume_at:
            return  # another send already paused everything
        pause = random.uniform(self._away_pause / 2, self._away_pause)  # noqa: S311 (jitter)
        self._away_pause = min(self._away_pause * 2, AWAY_PAUSES_S[1])
        self._probing = True
        self._resume_at = self._loop.time() + pause
        self._loop.call_later(pause, self._send_now)

    def _took(self, invocation_id: str) -> None:
        self._probing = False
        self._away_pause = AWAY_PAUSES_S[0]
        self._failures.pop(invocation_id, None)
        if not self._taken:
            self._loop.call_soon(self._forget_taken)
        self._taken.append(invocation_id)
        self._settle(invocation_id)

    def _forget_taken(self) -> None:
        """Delete the reports taken meanwhile, in one write."""
        taken, self._taken = self._taken, []
        try:
            self._file.delete(taken)
        except sqlite3.Error as exc:
            log.warning("the outbox %s cannot be written (%s)", self.path, exc)

    def _refused(self, invocation_id: str, answer: str) -> None:
        self._failures.pop(invocation_id, None)
        log.error(
            "the plane refused the outcome of invocation %s: %s; the report stays in the outbox%s",
            invocation_id,
            answer,
            f" {self.path}" if self.path else "",
        )
        try:
            self._file.refuse(invocation_id, answer)
        except sqlite3.Error as exc:
            log.warning("the outbox %s cannot be written (%s)", self.path, exc)
        self._settle(invocation_id)

    def _retry_later(self, report: _Report, answer: str) -> None:
        invocation_id = report.invocation_id
        failures = self._failures[invocation_id] = self._failures.get(invocation_id, 0) + 1
        first, longest = REFUSED_PAUSES_S
        pause = min(first * 2 ** (failures - 1), longest)
        log.warning(
            "the plane failed on the outcome of invocation %s (%s); trying again in %.0f s",
            invocation_id,
            answer,
            pause,
        )
        self._loop.call_later(pause, self._enqueue, report)

    def _settle(self, invocation_id: str) -> None:
        with self._lock:
            taken = self._waiting.pop(invocation_id, None)
        if taken is not None:
            taken.set_result(None)

    async def _keep_alive(self) -> None:
        """Say this process lives, and take over the reports of those that ended."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                self._file.heartbeat()
            except sqlite3.Error as exc:
                log.warning("the outbox %s cannot be written (%s)", self.path, exc)
            self._take_over()

    async def _shutdown(self) -> None:
        self._shutting_down = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._taken:
            self._forget_taken()
        await self._transport.aclose()


_OPEN: weakref.WeakSet[Outbox] = weakref.WeakSet()
"""The outboxes not closed yet."""


@atexit.register
def _send_at_exit() -> None:
    """A process ending without closing its runtime closes its outboxes: what
    they hold is sent (reports wait ``REPORT_DELAY_S`` for company) instead of
    left for the next run, waiting ``EXIT_GRACE_S`` at most."""
    for outbox in list(_OPEN):
        outbox.close(EXIT_GRACE_S)
