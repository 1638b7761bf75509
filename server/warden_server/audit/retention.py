"""Retention: prune old records without losing the chain's verifiability.

Records are pruned oldest first, a chunk at a time. Each chunk is verified
before it goes (pruning never erases the evidence of tampering: it refuses),
and its deletion commits together with a signed checkpoint naming the last
pruned record's sequence number and hash, and a ``retention`` record in the
chain itself.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from warden.shared.canonical import compact_json
from warden_server.audit.chain import verify_rows
from warden_server.audit.checkpoint import CheckpointSigner
from warden_server.audit.times import parse_time
from warden_server.errors import InvalidRequest
from warden_server.records.chain import GENESIS
from warden_server.records.checkpoint import Checkpoint
from warden_server.records.events import AuditEvent, iso, now_iso
from warden_server.records.query import RecordFilter
from warden_server.store import Store, WriteTransaction

log = logging.getLogger(__name__)

CHUNK: Final = 20_000
"""Records per pruning transaction: small enough not to stall the writer for long."""


class PruneRefused(Exception):
    """The records to prune do not verify; they stay as evidence."""


@dataclass(frozen=True, slots=True)
class PruneResult:
    records: int
    """How many records were deleted."""
    through_seq: int | None
    """The last pruned sequence number (the checkpoint's), or None if nothing was old enough."""
    pruned_before: str


def prune(
    store: Store,
    signer: CheckpointSigner,
    *,
    before: str,
    now: datetime,
    chunk: int = CHUNK,
) -> PruneResult:
    """Delete every record older than ``before``, leaving a signed checkpoint.

    Args:
        before: ISO 8601, or a duration back from ``now`` (``90d``).

    Raises:
        PruneRefused: a record to be pruned fails verification.
        InvalidRequest: ``before`` is not a time, or is in the future.
    """
    cutoff = parse_time(before, now, "before")
    if cutoff > iso(now):
        raise InvalidRequest(
            f"before {before!r} is in the future: it would prune every record, the newest "
            "included; give a time in the past or a duration back from now (90d)"
        )
    keep = next(store.audit_records(RecordFilter(since=cutoff), limit=1), None)
    last = store.audit_newest()
    if last is None:
        return PruneResult(0, None, cutoff)
    through = keep["seq"] - 1 if keep is not None else last["seq"]
    deleted = 0
    while True:
        # From the newest checkpoint each time: another prune (the plane's
        # retention, an operator's command) may have moved it meanwhile.
        checkpoint = store.audit_checkpoint()
        start_seq = checkpoint.seq + 1 if checkpoint else 1
        prev_hash = checkpoint.hash if checkpoint else GENESIS
        if start_seq > through:
            break
        end = min(start_seq + chunk - 1, through)
        # Includes any residue below start_seq, which verification rejects.
        rows = list(store.audit_records(RecordFilter(through_seq=end)))
        result = verify_rows(rows, prev_hash, start_seq)
        if not result.ok:
            if _moved(store, checkpoint):
                continue  # pruned by another while these were read: not evidence
            raise PruneRefused(
                f"refusing to prune: seq {result.first_bad_seq} does not verify "
                f"({result.problem}); the records stay as evidence"
            )
        if not rows:
            break
        try:
            deleted += _prune_chunk(
                store,
                signer,
                start=start_seq,
                end=rows[-1]["seq"],
                end_hash=rows[-1]["hash"],
                cutoff=cutoff,
                records=len(rows),
            )
        except _Raced:
            continue
    return PruneResult(deleted, through if deleted else None, cutoff)


class _Raced(Exception):
    """Another prune committed between this chunk's reading and its own."""


def _moved(store: Store, read: Checkpoint | None) -> bool:
    """Whether the newest checkpoint is another than the one ``read``."""
    now = store.audit_checkpoint()
    return (now.seq if now else 0) != (read.seq if read else 0)


def _prune_chunk(
    store: Store,
    signer: CheckpointSigner,
    *,
    start: int,
    end: int,
    end_hash: str,
    cutoff: str,
    records: int,
) -> int:
    checkpoint = signer.sign(
        end, end_hash, created_at=now_iso(), pruned_before=cutoff, records=records
    )
    event = AuditEvent(
        kind="retention",
        status="pruned",
        reason=f"pruned {records} records through seq {end}",
        details=compact_json(
            {"through_seq": end, "hash": end_hash, "pruned_before": cutoff, "records": records}
        ),
    )

    def work(tx: WriteTransaction) -> int:
        if tx.audit_hash(start) is None:
            raise _Raced  # the chunk's first record went with another's prune
        if tx.audit_hash(end) != end_hash:
            raise PruneRefused(f"record {end} changed while it was being pruned")
        deleted = tx.prune_audit(checkpoint)
        tx.append_audit(event)
        return deleted

    return store.transact(work)


class RetentionScheduler:
    """Prunes records older than ``retention`` every ``interval`` seconds, on a thread."""

    def __init__(
        self, store: Store, signer: CheckpointSigner, *, retention: str, interval: float
    ) -> None:
        self._store = store
        self._signer = signer
        self._retention = retention
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warden-retention", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def run_once(self) -> PruneResult | None:
        try:
            result = prune(
                self._store,
                self._signer,
                before=self._retention,
                now=datetime.now(UTC),
            )
        except PruneRefused as exc:
            log.error("retention: %s", exc)
            return None
        except Exception:
            log.exception("retention failed; it runs again in %.0f s", self._interval)
            return None
        if result.records:
            log.info(
                "retention: pruned %d records through seq %s (older than %s)",
                result.records,
                result.through_seq,
                result.pruned_before,
            )
        return result

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._store.leads():  # once for every plane on the store
                self.run_once()
            self._stop.wait(self._interval)
