"""The audit store at a million records: insert throughput through the real
group-committing writer, and the typical queries of a security team.

Baselines, measured in the same run:

- insert: the same rows written by a bare ``executemany`` into a table with no
  hash chain and no indexes (the least a store could do);
- queries: the same query forced to a full table scan (``NOT INDEXED``), which
  is what every query would cost without the indexes;
- group commit: the same transactions committed one at a time.

Quick mode fills 1,000 records and judges no figure.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from benchmarks import verdict, write_results
from warden_server.audit import reader
from warden_server.audit.reader import AuditFilter
from warden_server.audit.times import parse_time
from warden_server.records.events import COLUMNS, AuditEvent, iso
from warden_server.store import SQLiteStore, WriteTransaction
from warden_server.store.audit_sql import NEWEST_FIRST

RECORDS: Final = 1_000_000
QUICK_RECORDS: Final = 1_000
PER_TRANSACTION: Final = 5_000
SPAN: Final = timedelta(days=30)
NOW: Final = datetime(2026, 6, 1, tzinfo=UTC)

SERVICES = [f"svc{i:02d}" for i in range(20)]
CAPABILITIES = [f"{s}.op{j:02d}" for s in SERVICES for j in range(10)]
TENANTS = [f"tenant{i:02d}" for i in range(50)]
ACTORS = [f"actor-{i:05d}" for i in range(5_000)]
FAILURES = [
    ("policy", "POLICY_DENIED"),
    ("input-validation", "INPUT_INVALID"),
    ("discovery", "CAPABILITY_NOT_FOUND"),
    ("authorization", "FORBIDDEN"),
    ("approval", "APPROVAL_REQUIRED"),
    ("execution", "NOT_ELIGIBLE"),
    ("output-validation", "OUTPUT_INVALID"),
]


@dataclass(frozen=True, slots=True)
class Result:
    name: str
    seconds: float
    baseline_seconds: float
    target: float
    """The highest acceptable ratio of ``seconds`` to ``baseline_seconds``."""
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.seconds / self.baseline_seconds

    @property
    def ok(self) -> bool:
        return self.ratio <= self.target


def run(quick: bool = False, records: int | None = None) -> bool:
    """Fill a store with ``records`` audit records (1,000,000; 1,000 when
    ``quick``), time the writer and the queries against their baselines, and
    return whether every target was met (quick: whether it ran)."""
    records = records or (QUICK_RECORDS if quick else RECORDS)
    rng = random.Random(6)  # the same log every run
    with tempfile.TemporaryDirectory(prefix="warden-bench-") as folder:
        path = Path(folder) / "audit.db"
        print(f"audit store: {records:,} records in {path.name}")
        results = [
            _insert(path, records, rng),
            _group_commit(Path(folder), transactions=64 if quick else 400),
        ]
        results += _queries(path, records, rng)
    _report(results, quick)
    ok = all(r.ok for r in results)
    figures = {
        "records": records,
        "results": [
            {
                "name": r.name,
                "seconds": r.seconds,
                "baseline_seconds": r.baseline_seconds,
                "ratio": r.ratio,
                "target_ratio_at_most": r.target,
                "ok": r.ok,
            }
            for r in results
        ],
    }
    write_results("audit", figures, ok=ok, quick=quick)
    return True if quick else ok


# -- insert --------------------------------------------------------------------


def _events(count: int, rng: random.Random, start: int = 0) -> Iterator[AuditEvent]:
    step = SPAN / max(count, 1)
    begin = NOW - SPAN
    for i in range(start, start + count):
        capability = rng.choice(CAPABILITIES)
        failed = rng.random() < 0.2
        stage, code = rng.choice(FAILURES) if failed else (None, None)
        actor = rng.choice(ACTORS)
        yield AuditEvent(
            kind="outcome" if i % 2 else "decision",
            status=("failed" if failed else "granted") if i % 2 == 0 else "succeeded",
            invocation_id=str(uuid.UUID(int=rng.getrandbits(128))),
            capability_id=capability,
            capability_version="1",
            service=capability.split(".")[0],
            actor_id=actor,
            tenant=TENANTS[int(actor[-5:]) % len(TENANTS)],
            surface="mcp",
            stage=stage,
            code=code,
            policy_revision="0" * 64,
            input_digest="sha256:" + "1" * 64,
            input='{"order_id":"A1","amount":120}',
            ts=iso(begin + step * (i - start)),
            trace_id=f"{rng.getrandbits(128):032x}",
        )


def _insert(path: Path, records: int, rng: random.Random) -> Result:
    store = SQLiteStore(path)
    events = _events(records, rng)
    started = time.perf_counter()
    try:
        written = 0
        while written < records:
            batch = [next(events) for _ in range(min(PER_TRANSACTION, records - written))]

            def work(tx: WriteTransaction, batch: list[AuditEvent] = batch) -> None:
                for event in batch:
                    tx.append_audit(event)

            store.transact(work)
            written += len(batch)
            if written % 100_000 == 0:
                print(f"  inserted {written:,}", flush=True)
    finally:
        store.close()
    seconds = (time.perf_counter() - started) / records
    sample = min(records, 100_000)
    baseline = _bare_insert(path.with_name("bare.db"), sample, random.Random(7)) / sample
    return Result(
        "insert through the writer (per record)",
        seconds,
        baseline,
        target=20.0,
        note=f"{1 / seconds:,.0f} records/s; hashing and indexing included",
    )


def _bare_insert(path: Path, count: int, rng: random.Random) -> float:
    rows = [
        event.row(i + 1, "0" * 64) | {"hash": "0" * 64}
        for i, event in enumerate(_events(count, rng))
    ]
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"CREATE TABLE t ({', '.join(COLUMNS)})")
    started = time.perf_counter()
    conn.execute("BEGIN")
    conn.executemany(
        f"INSERT INTO t VALUES ({', '.join(':' + c for c in COLUMNS)})",
        rows,
    )
    conn.execute("COMMIT")
    seconds = time.perf_counter() - started
    conn.close()
    return seconds


# -- group commit ----------------------------------------------------------------------


def _group_commit(folder: Path, transactions: int = 400, threads: int = 16) -> Result:
    def append(store: SQLiteStore) -> None:
        store.transact(lambda tx: tx.append_audit(AuditEvent(kind="policy", status="ok")))

    one_by_one = SQLiteStore(folder / "sequential.db")
    started = time.perf_counter()
    for _ in range(transactions):
        append(one_by_one)
    sequential = time.perf_counter() - started
    one_by_one.close()

    grouped = SQLiteStore(folder / "grouped.db")
    per_thread = transactions // threads

    def client() -> None:
        for _ in range(per_thread):
            append(grouped)

    workers = [threading.Thread(target=client) for _ in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    concurrent = time.perf_counter() - started
    batches = grouped.batches_committed
    grouped.close()
    return Result(
        f"{transactions} transactions from {threads} threads",
        concurrent,
        sequential,
        target=0.6,
        note=f"{transactions / batches:.1f} transactions per commit; baseline one per commit",
    )


# -- queries ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    name: str
    run: Callable[[SQLiteStore], object]
    baseline: tuple[str, dict[str, Any]]
    target: float


def _queries(path: Path, records: int, rng: random.Random) -> list[Result]:
    store = SQLiteStore(path)
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "SELECT invocation_id, actor_id, tenant, capability_id FROM audit_events WHERE seq = ?",
            (records // 2,),
        ).fetchone()
        invocation, actor, tenant, capability = row
        deep = conn.execute(
            f"SELECT seq FROM audit_events ORDER BY {NEWEST_FIRST} LIMIT 1 OFFSET ?",
            (records // 3,),
        ).fetchone()[0]
        queries = [
            _newest("newest 100", AuditFilter(), target=0.01),
            _newest("capability, newest 100", AuditFilter(capabilities=(capability,)), 0.05),
            _newest(
                "capability glob svc07.*, newest 100", AuditFilter(capabilities=("svc07.*",)), 0.05
            ),
            _newest(
                "rare capability glob svc07.op0[12], newest 100",
                AuditFilter(capabilities=("svc07.op0[12]",)),
                0.05,
            ),
            _newest("actor, newest 100", AuditFilter(actor=actor), 0.05),
            _newest("stage policy, newest 100", AuditFilter(stage="policy"), 0.05),
            _newest("invocation", AuditFilter(invocation=invocation), 0.01),
            _newest(
                "tenant in the last day",
                AuditFilter(tenant=tenant, since="1d"),
                0.05,
            ),
            _newest(
                "one hour a week ago",
                AuditFilter(since="7d", until=iso(NOW - timedelta(days=7) + timedelta(hours=1))),
                0.05,
            ),
            Query(
                "a page deep in history (keyset)",
                lambda s: reader.query(s, AuditFilter(), now=NOW, before=deep),
                _baseline(
                    AuditFilter(),
                    f"(ts, seq) < (SELECT ts, seq FROM audit_events WHERE seq = {int(deep)})",
                ),
                0.05,
            ),
            _stats("stats by stage, last day", "stage", AuditFilter(since="1d"), 0.1),
            _stats("stats by capability, last hour", "capability", AuditFilter(since="1h"), 0.05),
            Query(
                "export the last hour",
                lambda s: sum(1 for _ in reader.export(s, AuditFilter(since="1h"), now=NOW)),
                _baseline(AuditFilter(since="1h"), order="seq", limit=None),
                0.1,  # every record becomes a dict: the cost grows with the hour's records
            ),
        ]
        return [_time(store, conn, q) for q in queries]
    finally:
        conn.close()
        store.close()


def _bare_where(f: AuditFilter) -> tuple[str, dict[str, Any]]:
    """What ``f`` selects, as the plain SQL condition a person would write.

    Built apart from the reader, so that the baselines measure the reader's
    query plans rather than reuse them.
    """
    clauses: list[str] = []
    params: dict[str, Any] = {}
    exact = {
        "actor_id": f.actor,
        "tenant": f.tenant,
        "stage": f.stage,
        "code": f.code,
        "status": f.status,
        "kind": f.kind,
        "invocation_id": f.invocation,
        "seq": f.seq,
    }
    for column, value in exact.items():
        if value is not None:
            clauses.append(f"{column} = :{column}")
            params[column] = value
    if f.capabilities:
        names = [f"cap{i}" for i in range(len(f.capabilities))]
        clauses.append("(" + " OR ".join(f"capability_id GLOB :{n}" for n in names) + ")")
        params.update(zip(names, f.capabilities, strict=True))
    if f.since is not None:
        clauses.append("ts >= :since")
        params["since"] = parse_time(f.since, NOW, "since")
    if f.until is not None:
        clauses.append("ts < :until")
        params["until"] = parse_time(f.until, NOW, "until")
    return " AND ".join(clauses), params


def _baseline(
    f: AuditFilter, extra: str = "", *, order: str = NEWEST_FIRST, limit: int | None = 101
) -> tuple[str, dict[str, Any]]:
    where, params = _bare_where(f)
    clauses = " AND ".join(c for c in (where, extra) if c)
    sql = "SELECT * FROM audit_events NOT INDEXED"  # the same query, without the indexes
    if clauses:
        sql += f" WHERE {clauses}"
    sql += f" ORDER BY {order}"
    if limit is not None:
        sql += f" LIMIT {limit}"
    return sql, params


def _newest(name: str, f: AuditFilter, target: float) -> Query:
    return Query(name, lambda s: reader.query(s, f, now=NOW), _baseline(f), target)


def _stats(name: str, by: str, f: AuditFilter, target: float) -> Query:
    column = reader.GROUPINGS[by]
    where, params = _bare_where(f)
    sql = (
        f"SELECT {column}, count(*), min(ts), max(ts) FROM audit_events NOT INDEXED"
        + (f" WHERE {where}" if where else "")
        + f" GROUP BY {column}"
    )
    return Query(name, lambda s: reader.stats(s, by, f, now=NOW), (sql, params), target)


def _time(store: SQLiteStore, conn: sqlite3.Connection, query: Query) -> Result:
    def best(call: Callable[[], object], rounds: int) -> float:
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        return min(times)

    query.run(store)  # warm the page cache for both
    seconds = best(lambda: query.run(store), 5)
    sql, params = query.baseline
    baseline = best(lambda: conn.execute(sql, params).fetchall(), 2)
    return Result(query.name, seconds, baseline, query.target)


def _report(results: list[Result], quick: bool) -> None:
    print()
    print(f"{'benchmark':44} {'time':>10} {'baseline':>10} {'ratio':>8} {'target':>8}")
    for r in results:
        print(
            f"{r.name:44} {_ms(r.seconds):>10} {_ms(r.baseline_seconds):>10} "
            f"{r.ratio:>8.4f} {r.target:>8.4f}  {verdict(r.ok, quick)}"
            + (f"  ({r.note})" if r.note else "")
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}ms" if seconds < 1 else f"{seconds:.2f}s"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_audit", description=__doc__)
    parser.add_argument(
        "--records",
        type=int,
        help=f"Audit records to insert before timing queries (default: {RECORDS:,}).",
    )
    parser.add_argument("--quick", action="store_true", help="1,000 records; judge nothing.")
    args = parser.parse_args()
    sys.exit(0 if run(quick=args.quick, records=args.records) else 1)
