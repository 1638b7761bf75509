"""Grants: Ed25519-signed, expiring permission to run one handler once.

A grant is a JWT (``alg: EdDSA``, see ``warden.shared.grant_token``) bound to
the invocation id, capability id and version, actor and input digest.
``Complete`` presents it; a downstream service verifies it with the public
keys the plane publishes (``GrantKeys.ListGrantKeys``) without calling the plane.

Rotation: the signing key signs; verification keys are published and accepted
but never sign. To rotate, publish the new key as a verification key first,
then make it the signing key and keep the old one as a verification key until
the grants it signed have expired (their time budget plus ``grants.ttl_seconds``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from warden.shared import grant_token
from warden.shared.grant_token import GrantClaims, GrantError

__all__ = ["GrantClaims", "GrantError", "GrantSigner", "PublishedKey"]


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

    def private_pem(self) -> bytes:
        """The signing key as PEM: for the other processes of this plane only."""
        return self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def with_signing_key(self, pem: bytes) -> GrantSigner:
        """These verification keys, signing with ``pem`` (another process's key)."""
        key = serialization.load_pem_private_key(pem, password=None)
        assert isinstance(key, Ed25519PrivateKey)
        return GrantSigner(key, list(self._keys.values()))

    @classmethod
    def from_files(cls, signing: Path | None, verification: Sequence[Path] = ()) -> GrantSigner:
        """Load the PEM Ed25519 signing key (a fresh one when ``signing`` is None)
        and the verification keys (PEM public keys, or private keys whose public
        half is used).

        Raises:
            ValueError: a file is not an Ed25519 key (the message names it).
            OSError: a file cannot be read.
        """
        if signing is None:
            private = Ed25519PrivateKey.generate()
        else:
            key = serialization.load_pem_private_key(signing.read_bytes(), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ValueError(
                    f"{signing}: grants are signed with Ed25519; this is not an Ed25519 key"
                )
            private = key
        published = []
        for path in verification:
            try:
                published.append(grant_token.load_public_key(path.read_bytes()))
            except ValueError as exc:
                raise ValueError(f"{path}: not an Ed25519 verification key ({exc})") from None
        return cls(private, published)

    def published(self) -> list[PublishedKey]:
        """Every key a current grant may be signed with, the signing key first."""
        return [
            PublishedKey(kid, grant_token.public_key_pem(key), kid == self.key_id)
            for kid, key in self._keys.items()
        ]

    def sign(self, claims: GrantClaims, *, now: float | None = None) -> str:
        issued = int(now if now is not None else time.time())
        return grant_token.encode(claims, self._private, issued_at=issued, kid=self.key_id)

    def verify(self, token: str, *, verify_expiry: bool = True) -> GrantClaims:
        """The claims of a grant this plane signed (with any published key).

        Raises:
            GrantError: a bad signature, a foreign key or (when asked) an expired grant.
        """
        return grant_token.decode(token, self._keys, verify_expiry=verify_expiry)
