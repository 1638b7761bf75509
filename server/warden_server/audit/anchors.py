"""Anchors: a head of the chain kept somewhere else, to catch what the chain alone cannot.

A hash chain shows an edited, deleted, inserted or reordered record, but not
its newest records cut off, nor the whole log rewritten by someone who can
write the file: a shorter or re-hashed chain is still a valid chain. An anchor
is the ``seq:hash`` of the head at some moment (``warden audit head``), kept
off the machine — a ticket, a log shipper, a printout. ``verify --anchor``
then checks that the record at that seq still exists with that hash: every
record up to it is then exactly as it was when the anchor was taken.

The plane also publishes anchors itself (``[audit] anchor_interval``): it
appends the head to an anchors file (``[audit] anchor_file``) on a schedule,
signed with the checkpoint key when it has the private half, for a log
shipper to carry off the machine; ``verify --anchors FILE`` checks the newest
one whose signature holds.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature

from warden.shared.canonical import canonical_json, compact_json
from warden_server.audit.checkpoint import CheckpointSigner, CheckpointVerifier
from warden_server.records.events import now_iso

if TYPE_CHECKING:
    from warden_server.store import Store

log = logging.getLogger(__name__)

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


# -- anchors the plane publishes -------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishedAnchor:
    """One line of the plane's anchors file: the head at ``at``, signed with the
    checkpoint key when the plane has its private half."""

    anchor: Anchor
    at: str
    key_id: str | None = None
    signature: str | None = None

    def signed_bytes(self) -> bytes:
        return canonical_json({"seq": self.anchor.seq, "hash": self.anchor.hash, "at": self.at})

    def line(self) -> str:
        return compact_json(
            {
                "seq": self.anchor.seq,
                "hash": self.anchor.hash,
                "at": self.at,
                "key_id": self.key_id,
                "signature": self.signature,
            }
        )

    @classmethod
    def parse(cls, line: str) -> PublishedAnchor:
        """One line of an anchors file.

        Raises:
            ValueError: the line is not a published anchor.
        """
        try:
            data = json.loads(line)
            anchor = Anchor.parse(f"{data['seq']}:{data['hash']}")
            return cls(anchor, str(data["at"]), data.get("key_id"), data.get("signature"))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not a published anchor ({exc})") from None

    def signed_by(self, verifier: CheckpointVerifier) -> bool:
        if not self.signature:
            return False
        try:
            signature = base64.b64decode(self.signature, validate=True)
            verifier.public_key.verify(signature, self.signed_bytes())
        except (InvalidSignature, ValueError):
            return False
        return True


def newest_published(path: Path, verifier: CheckpointVerifier | None) -> PublishedAnchor:
    """The newest anchor of an anchors file whose signature holds under
    ``verifier``. Without a key, the newest anchor as written, and only in a
    file of unsigned anchors (a plane that holds no checkpoint key writes
    those): signatures that cannot be checked would let a forged line count.

    Raises:
        ValueError: no usable anchor in the file, with why, naming ``file:line``;
            or signed anchors and no key to check them with.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    if verifier is None:
        signed = next(
            (n for n, line in enumerate(lines, 1) if '"signature"' in line and _signed(line)), None
        )
        if signed is not None:
            raise ValueError(
                f"{path}:{signed}: the anchors are signed, and there is no checkpoint key "
                "to check them with (--public-key or [audit] checkpoint_key_file): a line "
                "forged without the key would count"
            )
    problems = []
    for number in range(len(lines), 0, -1):
        text = lines[number - 1].strip()
        if not text:
            continue
        try:
            published = PublishedAnchor.parse(text)
        except ValueError as exc:
            problems.append(f"{path}:{number}: {exc}")
            continue
        if verifier is not None and not published.signed_by(verifier):
            problems.append(f"{path}:{number}: not signed by key {verifier.key_id}")
            continue
        return published
    raise ValueError("; ".join(problems[:3]) or f"{path}: no anchors")


def _signed(line: str) -> bool:
    try:
        return bool(PublishedAnchor.parse(line.strip()).signature)
    except ValueError:
        return False


class AnchorPublisher:
    """Appends the chain's head to an anchors file every ``interval`` seconds,
    when it moved, on a thread; ship the file off the machine (a log shipper)."""

    def __init__(
        self,
        store: Store,
        path: Path,
        *,
        interval: float,
        signer: CheckpointSigner | None,
    ) -> None:
        self._store = store
        self._path = path
        self._interval = interval
        self._signer = signer
        self._last: Anchor | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warden-anchors", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self._store.leads():  # the head at stop, so the newest records are covered too
            self.publish()

    def publish(self) -> PublishedAnchor | None:
        """Append the head now, unless it is the one published last."""
        try:
            anchor = head(self._store.audit_newest())
            if anchor is None or anchor == self._last:
                return None
            published = PublishedAnchor(anchor, now_iso())
            if self._signer is not None:
                signature = self._signer.sign_bytes(published.signed_bytes())
                published = PublishedAnchor(anchor, published.at, self._signer.key_id, signature)
            with self._path.open("a", encoding="utf-8") as file:
                file.write(published.line() + "\n")
                file.flush()
                os.fsync(file.fileno())
        except Exception:
            log.exception("could not publish the audit chain's head to %s", self._path)
            return None
        self._last = anchor
        return published

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if self._store.leads():  # once for every plane on the store
                self.publish()
