"""Signed retention checkpoints: the chain's new starting point after pruning.

Pruning deletes the oldest records. Before it does, it signs the sequence
number and hash of the last record it deletes, with an Ed25519 key of the
plane. ``verify`` then starts from the newest checkpoint whose signature
holds, so the chain still verifies over what remains and still names any
record edited, deleted or inserted afterwards. A forged checkpoint (one that
would hide more deletions) needs the private key.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from warden_server.records.checkpoint import Checkpoint, signed_bytes


class CheckpointKeyError(ValueError):
    """The checkpoint key is missing, unreadable or not Ed25519."""


def key_id(public_key: Ed25519PublicKey) -> str:
    """A short, stable name for a public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.urlsafe_b64encode(hashlib.sha256(raw).digest()[:12]).decode()


class CheckpointVerifier:
    """Checks checkpoint signatures with the plane's public key."""

    def __init__(self, public_key: Ed25519PublicKey) -> None:
        self.public_key = public_key
        self.key_id = key_id(public_key)

    @classmethod
    def from_file(cls, path: Path) -> CheckpointVerifier:
        """Load a PEM Ed25519 key; a private key's public half is used.

        Raises:
            CheckpointKeyError: unreadable, or not an Ed25519 key.
        """
        key = _load_key(path)
        return cls(key.public_key() if isinstance(key, Ed25519PrivateKey) else key)

    def check(self, checkpoint: Checkpoint) -> bool:
        """Whether this key signed exactly this checkpoint."""
        try:
            signature = base64.b64decode(checkpoint.signature, validate=True)
            self.public_key.verify(signature, checkpoint.signed_bytes())
        except (InvalidSignature, ValueError):
            return False
        return True


class CheckpointSigner(CheckpointVerifier):
    """Signs checkpoints with the plane's private key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        super().__init__(private_key.public_key())
        self._private = private_key

    @classmethod
    def from_private_file(cls, path: Path) -> CheckpointSigner:
        """Load a PEM Ed25519 private key.

        Raises:
            CheckpointKeyError: unreadable, public only, or not Ed25519.
        """
        key = _load_key(path)
        if not isinstance(key, Ed25519PrivateKey):
            raise CheckpointKeyError(f"{path}: pruning signs checkpoints and needs the private key")
        return cls(key)

    def sign_bytes(self, data: bytes) -> str:
        """An Ed25519 signature of ``data``, base64."""
        return base64.b64encode(self._private.sign(data)).decode()

    def sign(
        self, seq: int, hash: str, *, created_at: str, pruned_before: str, records: int
    ) -> Checkpoint:
        signature = self._private.sign(signed_bytes(seq, hash, created_at, pruned_before, records))
        return Checkpoint(
            seq=seq,
            hash=hash,
            created_at=created_at,
            pruned_before=pruned_before,
            records=records,
            key_id=self.key_id,
            signature=base64.b64encode(signature).decode(),
        )


def _load_key(path: Path) -> Ed25519PrivateKey | Ed25519PublicKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointKeyError(f"{path}: {exc.strerror or exc}") from None
    loaded: object
    try:
        loaded = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        try:
            loaded = serialization.load_pem_public_key(data)
        except ValueError:
            raise CheckpointKeyError(f"{path}: not a PEM key") from None
    if not isinstance(loaded, Ed25519PrivateKey | Ed25519PublicKey):
        raise CheckpointKeyError(f"{path}: checkpoints are signed with Ed25519; this is not one")
    return loaded
