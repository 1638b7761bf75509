"""Grants: Ed25519-signed, expiring permission to run one handler once.

A grant is a JWT (``alg: EdDSA``) bound to the invocation id, capability id and
version, actor and input digest. ``Complete`` presents it; a downstream service
can verify it with the plane's public key without calling the plane.
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

GRANT_ISSUER = "warden"


class GrantError(Exception):
    """A presented grant is forged, expired or bound to something else."""


@dataclass(frozen=True, slots=True)
class GrantClaims:
    invocation_id: str
    capability_id: str
    capability_version: str
    service: str
    actor_id: str
    input_digest: str
    expires_at: int


class GrantSigner:
    """Signs grants with one Ed25519 key and verifies the plane's own grants."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private = private_key
        self._public: Ed25519PublicKey = private_key.public_key()
        raw = self._public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.key_id = base64.urlsafe_b64encode(hashlib.sha256(raw).digest()[:12]).decode()

    @classmethod
    def from_file(cls, path: Path | None) -> GrantSigner:
        """Load a PEM Ed25519 private key, or generate a fresh one when ``path`` is None."""
        if path is None:
            return cls(Ed25519PrivateKey.generate())
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path}: grants are signed with Ed25519; this is not an Ed25519 key")
        return cls(key)

    @property
    def public_key_pem(self) -> str:
        return self._public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode()

    def sign(self, claims: GrantClaims, *, now: float | None = None) -> str:
        issued = int(now if now is not None else time.time())
        payload: dict[str, Any] = {
            "iss": GRANT_ISSUER,
            "jti": claims.invocation_id,
            "sub": claims.actor_id,
            "cap": claims.capability_id,
            "ver": claims.capability_version,
            "svc": claims.service,
            "dig": claims.input_digest,
            "iat": issued,
            "exp": claims.expires_at,
        }
        return jwt.encode(payload, self._private, algorithm="EdDSA", headers={"kid": self.key_id})

    def verify(self, token: str, *, verify_expiry: bool = True) -> GrantClaims:
        """The claims of a grant this plane signed.

        Raises:
            GrantError: a bad signature, a foreign key or (when asked) an expired grant.
        """
        try:
            payload = jwt.decode(
                token,
                self._public,
                algorithms=["EdDSA"],
                issuer=GRANT_ISSUER,
                options={"verify_exp": verify_expiry, "require": ["jti", "exp", "dig"]},
            )
        except jwt.ExpiredSignatureError:
            raise GrantError("grant expired") from None
        except jwt.PyJWTError as exc:
            raise GrantError(f"grant rejected: {exc}") from None
        return GrantClaims(
            invocation_id=payload["jti"],
            capability_id=payload["cap"],
            capability_version=payload["ver"],
            service=payload["svc"],
            actor_id=payload["sub"],
            input_digest=payload["dig"],
            expires_at=payload["exp"],
        )
