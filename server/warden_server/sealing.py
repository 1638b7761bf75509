"""Sealing recorded outputs for idempotent replay.

A replay must hand back the output exactly as the handler returned it,
sensitive fields included, yet the store must never hold a sensitive value in
clear (SI-5). So the plane keeps a replayable output only sealed: AES-256-GCM
under a key derived from ``idempotency.replay_key``, bound (as associated
data) to the reservation it answers, so a sealed output cannot be moved to
another key, actor or input.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from warden_server import keyfiles

_NONCE_BYTES: Final = 12
_INFO: Final = b"warden idempotent replay v1"


class Sealer:
    """Seals and opens replayable outputs with one key."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        """The AES-GCM key: for the other processes of this plane only."""
        self._aead = AESGCM(key)

    def fingerprint(self) -> str:
        """A digest that tells keys apart without giving the key away (HMAC-SHA256
        of a fixed text): replicas compare theirs in the shared database."""
        return hmac.new(self.key, b"warden replay key check", hashlib.sha256).hexdigest()

    @classmethod
    def from_secret(cls, secret: str | None) -> Sealer:
        """A sealer keyed by ``secret`` (through HKDF-SHA256), or by a fresh
        random key when ``secret`` is None."""
        if secret is None:
            return cls(AESGCM.generate_key(bit_length=256))
        kdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO)
        return cls(kdf.derive(secret.encode()))

    @classmethod
    def beside(cls, store: Path) -> Sealer:
        """A sealer keyed by the plane's own replay key, made once beside the
        store (``<store>.replay-key``, 0600), so that what was sealed before a
        restart still opens after it.

        Raises:
            KeyFileError: the key file cannot be made or used.
        """
        key = keyfiles.hex_key(keyfiles.beside(store, "replay-key"), create=True)
        assert key is not None  # made when missing
        return cls(key)

    def seal(self, plaintext: str, binding: str) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, plaintext.encode(), binding.encode())

    def open(self, sealed: bytes, binding: str) -> str | None:
        """The plaintext, or None when it was sealed under another key or binding."""
        nonce, body = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]
        try:
            return self._aead.decrypt(nonce, body, binding.encode()).decode()
        except (InvalidTag, ValueError):
            return None
