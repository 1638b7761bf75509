"""Grants: Ed25519-signed, expiring permission to run one handler once.

A grant is a JWT (``alg: EdDSA``, see ``warden.shared.grant_token``) bound to
the invocation id, capability id and version, actor and input digest.
``Complete`` presents it; a downstream service verifies it with the public
keys the plane publishes (``GrantKeys.ListGrantKeys``) without calling the plane.

Rotation: the signing key signs; verification keys are published and accepted
but never sign. To rotate, publish the new key as a verification key first,
then make it the signing key and keep the old one as a verification key until
the grants it signed have expired (their time budget plus ``grants.ttl_seconds``).

Without a configured signing key the plane makes one once, beside the store
(``default_key_path``), and signs with it at every start: a grant outlives a
restart, so an outcome reported after one is still accepted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from warden.shared import grant_token
from warden.shared.grant_token import GrantClaims, GrantError
from warden_server import keyfiles

__all__ = ["GrantClaims", "GrantError", "GrantSigner", "PublishedKey", "default_key_path"]

log = logging.getLogger(__name__)

ISSUED_REMEMBERED = 8_192
"""Grants a process remembers having signed, newest first: ``Complete`` comes
back with one moments later, and a token that is byte for byte one this
process signed needs no signature check (about a tenth of Complete's work).
One that another process signed with the same key is checked by signing its
claims again (``grant_token.signed_as``), a fifth of the cost of decoding it."""


def default_key_path(store: Path) -> Path:
    """Where the plane keeps the signing key it made itself: beside the store."""
    return keyfiles.beside(store, "grant-key")


@dataclass(frozen=True, slots=True)
class PublishedKey:
    key_id: str
    public_key_pem: str
    signing: bool


class GrantSigner:
    """Signs grants with one Ed25519 key; verifies with it and the verification keys."""

    def __init__(
        self,
        private_key: Ed25519PrivateKey,
        verification_keys: Sequence[Ed25519PublicKey] = (),
    ) -> None:
        self._private = private_key
        signing = private_key.public_key()
        self.key_id = grant_token.key_id(signing)
        self._keys: dict[str, Ed25519PublicKey] = {self.key_id: signing}
        for key in verification_keys:
            self._keys.setdefault(grant_token.key_id(key), key)
        self._issued: dict[str, GrantClaims] = {}
        self._issued_lock = threading.Lock()

    def private_pem(self) -> bytes:
        """The signing key as PEM: for the other processes of this plane only."""
        return self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    @classmethod
    def from_pem(cls, pem: bytes, verification: Sequence[Path] = ()) -> GrantSigner:
        """Signing with the PEM key ``pem`` (another process's), verifying with it
        and the verification key files."""
        return cls(_private_key(pem, "the signing key"), _verification_keys(verification))

    @classmethod
    def from_files(
        cls, signing: Path, verification: Sequence[Path] = (), *, create: bool = False
    ) -> GrantSigner:
        """Load the PEM Ed25519 signing key and the verification keys (PEM public
        keys, or private keys whose public half is used). With ``create``, a
        missing signing key file is made first (``create_key_file``).

        Raises:
            ValueError: a file is not an Ed25519 key (the message names it).
            OSError: a file cannot be read (or, with ``create``, written).
        """
        if create and not signing.exists():
            create_key_file(signing)
        private = _private_key(_read(signing, "[grants] signing_key_file"), str(signing))
        return cls(private, _verification_keys(verification))

    def published(self) -> list[PublishedKey]:
        """Every key a current grant may be signed with, the signing key first."""
        return [
            PublishedKey(kid, grant_token.public_key_pem(key), kid == self.key_id)
            for kid, key in self._keys.items()
        ]

    def sign(self, claims: GrantClaims, *, now: float | None = None) -> str:
        issued = int(now if now is not None else time.time())
        token = grant_token.encode(claims, self._private, issued_at=issued, kid=self.key_id)
        with self._issued_lock:
            self._issued[token] = claims
            if len(self._issued) > ISSUED_REMEMBERED:
                del self._issued[next(iter(self._issued))]
        return token

    def verify(self, token: str, *, verify_expiry: bool = True) -> GrantClaims:
        """The claims of a grant this plane signed (with any published key).

        Raises:
            GrantError: a bad signature, a foreign key or (when asked) an expired grant.
        """
        claims = self._issued.get(token)
        if claims is None:
            # Signed by another process of this plane (the same key), or
            # before this process remembered it.
            claims = grant_token.signed_as(token, self._private, kid=self.key_id)
        if claims is None:
            return grant_token.decode(token, self._keys, verify_expiry=verify_expiry)
        if verify_expiry and time.time() >= claims.expires_at:
            raise GrantError("grant expired")
        return claims


def create_key_file(path: Path) -> None:
    """Make a fresh Ed25519 key at ``path``, readable by its owner alone (0600),
    unless another process makes one there first.

    The key is written whole to a temporary file beside ``path`` and linked into
    place, which fails when ``path`` exists: two planes starting together on one
    store both end up signing with the one key that was linked first.

    Raises:
        KeyFileError: the folder cannot be made or written.
    """
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    if not keyfiles.write_once(path, pem):
        return  # another process made it first: its key is the key
    log.info("made a grant signing key at %s", path)


def _private_key(pem: bytes, source: str) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except ValueError as exc:
        raise ValueError(f"{source}: not a PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{source}: grants are signed with Ed25519; this is not an Ed25519 key")
    return key


def _read(path: Path, setting: str) -> bytes:
    """A key file's bytes.

    Raises:
        OSError: it cannot be read; the message names the file and its setting.
    """
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OSError(f"{path}: cannot read this key ({setting}): {exc.strerror or exc}") from None


def _verification_keys(paths: Sequence[Path]) -> list[Ed25519PublicKey]:
    published = []
    for path in paths:
        pem = _read(path, "[grants] verification_key_files")
        try:
            published.append(grant_token.load_public_key(pem))
        except ValueError as exc:
            raise ValueError(f"{path}: not an Ed25519 verification key ({exc})") from None
    return published
