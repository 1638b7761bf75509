"""Anchors: a head of the chain kept somewhere else, to catch what the chain alone cannot.

A hash chain shows an edited, deleted, inserted or reordered record, but not
its newest records cut off, nor the whole log rewritten by someone who can
write the file: a shorter or re-hashed chain is still a valid chain. An anchor
is the ``seq:hash`` of the head at some moment (``warden audit head``), kept
off the machine — a ticket, a log shipper, a printout. ``verify --anchor``
then checks that the record at that seq still exists with that hash: every
record up to it is then exactly as it was when the anchor was taken.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_ANCHOR = re.compile(r"^(\d+):([0-9a-f]{64})$")


@dataclass(frozen=True, slots=True)
class Anchor:
    seq: int
    hash: str

    @classmethod
    def parse(cls, text: str) -> Anchor:
        """``SEQ:HASH`` as ``warden audit head`` prints it.

        Raises:
            ValueError: the text is not an anchor.
        """
        match = _ANCHOR.match(text.strip())
        if not match:
            raise ValueError(f"{text!r} is not an anchor: expected SEQ:HASH (64 hex digits)")
        return cls(int(match.group(1)), match.group(2))

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"


def head(newest: Mapping[str, Any] | None) -> Anchor | None:
    """The anchor for the newest record, or None for an empty log."""
    return Anchor(int(newest["seq"]), str(newest["hash"])) if newest else None


def check(
    anchor: Anchor, record: Mapping[str, Any] | None, newest: Mapping[str, Any] | None
) -> str | None:
    """What is wrong with the log against ``anchor``, or None when it holds.

    ``record`` is the record at ``anchor.seq`` now, if there is one, and
    ``newest`` the log's newest record. (An anchor older than a retention
    checkpoint points at a pruned record; the caller skips it.)
    """
    if record is None:
        now = f"the log now ends at seq {newest['seq']}" if newest else "the log is empty"
        return (
            f"anchor {anchor.seq}: the record is gone ({now}): records were cut off "
            "or the log was replaced"
        )
    if record["hash"] != anchor.hash:
        return f"anchor {anchor.seq}: the record has another hash: the log was rewritten"
    return None
