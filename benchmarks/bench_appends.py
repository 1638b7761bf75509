"""What an append costs as the store grows, by the kind of ids it indexes.

The store's own writer (``SQLiteStore``) appends what a granted ``Begin``
writes: the invocation id claimed, the invocation, and its decision record
(eight to a commit, as under load). Once with invocation and call ids made as
the SDKs make them (UUIDv7, time-ordered), once with random UUIDv4s as they
were made before. Each round appends ``RECORDS`` more and reports the CPU of
the process per record (the writer's thread included) and the size of the
file.

A random id lands at a random place in each index on it, and once the store
outgrows the writer's cache every append reads, dirties and writes back one
more page per such index. Judged: at the largest size, a time-ordered append
costs less than a random one, and at most ``GROWTH_LIMIT`` times what it cost
in the first round. These guard the choice of ids (``warden/shared/ids.py``);
they are not targets of the performance issue.

Quick mode: 2 rounds of 400 records; no figure is judged.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from benchmarks import verdict, write_results
from warden.shared.ids import uuid7
from warden_server.records.events import AuditEvent
from warden_server.store import InvocationRecord, WriteTransaction
from warden_server.store.sqlite import SQLiteStore

ROUNDS = 4
RECORDS = 40_000
QUICK_ROUNDS = 2
QUICK_RECORDS = 400
PER_COMMIT = 8
GROWTH_LIMIT = 1.25

IDS: dict[str, Callable[[], str]] = {
    "uuid7": lambda: str(uuid7()),
    "uuid4": lambda: str(uuid.uuid4()),
}


def run(quick: bool = False) -> bool:
    rounds, records = (QUICK_ROUNDS, QUICK_RECORDS) if quick else (ROUNDS, RECORDS)
    print(f"appends: {PER_COMMIT} grants per commit, {records:,} per round, CPU per record")
    measured = {kind: _rounds(make_id, rounds, records) for kind, make_id in IDS.items()}
    print(f"  {'store size':>10}  " + "  ".join(f"{kind:>8}" for kind in IDS))
    for i in range(rounds):
        size = measured["uuid7"][i][1]
        cells = "  ".join(f"{measured[kind][i][0] * 1e6:5.0f} us" for kind in IDS)
        print(f"  {size / 1e6:7.0f} MB  {cells}")
    ordered_first, ordered_last = measured["uuid7"][0][0], measured["uuid7"][-1][0]
    random_last = measured["uuid4"][-1][0]
    cheaper = ordered_last < random_last
    growth = ordered_last / ordered_first
    steady = growth <= GROWTH_LIMIT
    print(
        f"  time-ordered ids cost less at the largest size: {ordered_last * 1e6:.0f} against "
        f"{random_last * 1e6:.0f} us  {verdict(cheaper, quick)}"
    )
    print(
        f"  time-ordered: largest size / first round <= {GROWTH_LIMIT}: {growth:.2f}  "
        f"{verdict(steady, quick)}"
    )
    ok = quick or (cheaper and steady)
    write_results(
        "appends",
        {
            kind: [{"seconds_per_record": s, "store_bytes": b} for s, b in figures]
            for kind, figures in measured.items()
        },
        ok=ok,
        quick=quick,
    )
    return ok


def _rounds(make_id: Callable[[], str], rounds: int, records: int) -> list[tuple[float, int]]:
    """(CPU seconds per record, file size after) for each round, on a fresh store."""
    with tempfile.TemporaryDirectory(prefix="warden-bench-") as folder:
        path = Path(folder) / "warden.db"
        store = SQLiteStore(path)
        try:
            figures = []
            for _ in range(rounds):
                started = time.process_time()
                for _ in range(records // PER_COMMIT):
                    grants = [_grant(make_id(), make_id()) for _ in range(PER_COMMIT)]
                    for outcome in store.transact_each(grants):
                        if isinstance(outcome, BaseException):
                            raise outcome
                spent = time.process_time() - started
                figures.append((spent / records, path.stat().st_size))
            return figures
        finally:
            store.close()


def _grant(invocation_id: str, call_id: str) -> Callable[[WriteTransaction], None]:
    """What a granted Begin writes, as ``pipeline/begin.py`` writes it."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    invocation = InvocationRecord(
        invocation_id=invocation_id,
        service="bench",
        capability_id="bench.refund",
        capability_version="1",
        actor_id="user-7",
        tenant="acme",
        surface="direct",
        input_digest="sha256:" + "0" * 64,
        state="granted",
        granted_at=now,
        expires_at=now,
        call_id=call_id,
        attempt=1,
    )
    decision = AuditEvent(
        kind="decision",
        status="granted",
        invocation_id=invocation_id,
        capability_id="bench.refund",
        capability_version="1",
        service="bench",
        actor_id="user-7",
        tenant="acme",
        surface="direct",
        stage="execution",
        policy_revision="0" * 64,
        rules='[{"id":"allow-members","effect":"allow"}]',
        input_digest=invocation.input_digest,
        input='{"order_id":"A1","amount":120}',
        call_id=call_id,
        attempt=1,
    )

    def work(tx: WriteTransaction) -> None:
        if not tx.claim_invocation(invocation_id):
            raise AssertionError(f"invocation id {invocation_id} was claimed twice")
        tx.insert_invocation(invocation)
        tx.append_audit(decision)

    return work


if __name__ == "__main__":
    raise SystemExit(0 if run(quick="--quick" in sys.argv[1:]) else 1)
