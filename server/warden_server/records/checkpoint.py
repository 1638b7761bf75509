"""A retention checkpoint: the chain's new starting point after pruning (one
row of ``audit_checkpoints``; ``audit.checkpoint`` signs and checks them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from warden.shared.canonical import canonical_json


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One row of ``audit_checkpoints``.

    Attributes:
        seq: The last pruned record's sequence number; the chain resumes at seq + 1.
        hash: That record's hash: the ``prev_hash`` of record seq + 1.
        created_at: When the pruning ran.
        pruned_before: The cutoff: records older than this were pruned.
        records: How many records this pruning deleted.
        key_id: Which key signed it.
        signature: Ed25519 over the canonical JSON of the fields above but these two.
    """

    seq: int
    hash: str
    created_at: str
    pruned_before: str
    records: int
    key_id: str
    signature: str

    def signed_bytes(self) -> bytes:
        return signed_bytes(self.seq, self.hash, self.created_at, self.pruned_before, self.records)

    def row(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "hash": self.hash,
            "created_at": self.created_at,
            "pruned_before": self.pruned_before,
            "records": self.records,
            "key_id": self.key_id,
            "signature": self.signature,
        }


def signed_bytes(seq: int, hash: str, created_at: str, pruned_before: str, records: int) -> bytes:
    return canonical_json(
        {
            "seq": seq,
            "hash": hash,
            "created_at": created_at,
            "pruned_before": pruned_before,
            "records": records,
        }
    )
