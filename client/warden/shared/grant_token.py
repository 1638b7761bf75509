"""The grant token: an Ed25519-signed JWT (``alg: EdDSA``, with a ``kid``).

The plane signs grants; the plane itself, the SDK's ``verify_grant`` and any
downstream service decode them with the plane's published public keys. The
claims are:

====== =====================================================
claim  meaning
====== =====================================================
iss    always ``warden``
jti    the invocation id
sub    the actor id
cap    the capability id
ver    the capability version
svc    the service that may run the handler
dig    ``sha256:<hex>`` of the RFC 8785 canonical input
iat    issued at (seconds since the epoch)
exp    expires at (seconds since the epoch)
====== =====================================================
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

GRANT_ISSUER: Final = "warden"
ALGORITHM: Final = "EdDSA"


class GrantError(Exception):
    """A grant is forged, expired, signed by an unknown key or bound to something else."""


@dataclass(frozen=True, slots=True)
class GrantClaims:
    """What a grant permits: one invocation of one capability version, for one
    actor and exactly one input (by digest), until ``expires_at``."""

    invocation_id: str
    capability_id: str
    capability_version: str
    service: str
    actor_id: str
    input_digest: str
    expires_at: int
    """Seconds since the epoch."""


def key_id(public_key: Ed25519PublicKey) -> str:
    """A key's id: the first 96 bits of the SHA-256 of its raw bytes, base64url."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.urlsafe_b64encode(hashlib.sha256(raw).digest()[:12]).decode()


def public_key_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def load_public_key(pem: str | bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM (a public key, or a private key's public half).

    Raises:
        ValueError: not PEM, or not an Ed25519 key.
    """
    data = pem.encode() if isinstance(pem, str) else pem
    if b"PRIVATE KEY" in data:
        private = serialization.load_pem_private_key(data, password=None)
        if not isinstance(private, Ed25519PrivateKey):
            raise ValueError("not an Ed25519 key")
        return private.public_key()
    public = serialization.load_pem_public_key(data)
    if not isinstance(public, Ed25519PublicKey):
        raise ValueError("not an Ed25519 key")
    return public


def encode(
    claims: GrantClaims,
    private_key: Ed25519PrivateKey,
    *,
    issued_at: int,
    kid: str | None = None,
) -> str:
    """Sign ``claims`` as a grant token (``kid``: the key's id, when known already)."""
    payload: dict[str, Any] = {
        "iss": GRANT_ISSUER,
        "jti": claims.invocation_id,
        "sub": claims.actor_id,
        "cap": claims.capability_id,
        "ver": claims.capability_version,
        "svc": claims.service,
        "dig": claims.input_digest,
        "iat": issued_at,
        "exp": claims.expires_at,
    }
    # A compact JWS (RFC 7515) written directly: the header is the same for
    # every grant of a key, and this runs for every grant the plane gives.
    signing_input = (
        _header(kid or key_id(private_key.public_key()))
        + b"."
        + _b64(json.dumps(payload, separators=(",", ":")).encode())
    )
    return (signing_input + b"." + _b64(private_key.sign(signing_input))).decode()


def signed_as(token: str, private_key: Ed25519PrivateKey, *, kid: str) -> GrantClaims | None:
    """The claims of ``token`` when it is exactly what ``encode`` writes with
    ``private_key`` (whose id is ``kid``), else None: the caller then decodes
    it as any other token.

    Ed25519 signatures are deterministic (RFC 8032, 5.1.6): one key signing
    one message always gives the same signature, so a token whose signature
    is the one this key gives its header and claims again was signed by this
    key. Signing again costs about a third of verifying, and a fifth of
    ``decode``.
    """
    signing_input, _, signature = token.rpartition(".")
    header, _, payload = signing_input.partition(".")
    if not signing_input.isascii() or header.encode() != _header(kid):
        return None
    expected = _b64(private_key.sign(signing_input.encode()))
    if not hmac.compare_digest(expected, signature.encode()):
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return _claims(claims)
    except (ValueError, binascii.Error, KeyError, TypeError):  # not what encode writes
        return None


@functools.lru_cache(maxsize=16)
def _header(kid: str) -> bytes:
    return _b64(json.dumps({"alg": ALGORITHM, "kid": kid, "typ": "JWT"}).encode())


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


_SEGMENT: Final = re.compile(r"[A-Za-z0-9_-]+")


def _canonical(token: str) -> bool:
    """Whether ``token`` is three segments of base64url as the plane writes
    them: the alphabet alone, no padding, no bits past the last byte. A
    decoder that skips the rest would take many texts for one grant."""
    parts = token.split(".")
    if len(parts) != 3:
        return False
    for number, part in enumerate(parts):
        if not _SEGMENT.fullmatch(part):
            if number == 2 and not part:
                continue  # no signature (alg none): refused as such below
            return False
        try:
            raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        except ValueError:
            return False
        if _b64(raw).decode() != part:
            return False
    return True


def decode(
    token: str,
    keys: Mapping[str, Ed25519PublicKey],
    *,
    verify_expiry: bool = True,
    now: float | None = None,
    leeway_s: float = 0,
) -> GrantClaims:
    """The claims of a grant signed by one of ``keys`` (by key id).

    Raises:
        GrantError: malformed, signed by a key not in ``keys``, a bad
            signature, or (when asked) expired.
    """
    if not _canonical(token):
        raise GrantError("not a grant token: not a well-formed JWT")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise GrantError("not a grant token: not a well-formed JWT") from None
    kid = header.get("kid")
    key = keys.get(kid) if isinstance(kid, str) else None
    if key is None:
        raise GrantError(f"signed by an unknown key (kid {kid!r})")
    try:
        payload = jwt.decode(
            token,
            key,
            algorithms=[ALGORITHM],
            issuer=GRANT_ISSUER,
            options={
                "verify_exp": False,
                "verify_iat": False,
                "require": ["iss", "jti", "sub", "cap", "ver", "svc", "dig", "exp"],
            },
        )
    except jwt.InvalidSignatureError:
        raise GrantError("grant rejected: bad signature") from None
    except jwt.InvalidIssuerError:
        raise GrantError("grant rejected: another issuer") from None
    except jwt.MissingRequiredClaimError as exc:
        raise GrantError(f"grant rejected: no {exc.claim} claim") from None
    except jwt.PyJWTError:
        # PyJWT's own words describe its internals, not the grant.
        raise GrantError("grant rejected: not a valid grant token") from None
    if not isinstance(payload["exp"], int):
        raise GrantError("grant rejected: exp is not an integer")
    claims = _claims(payload)
    moment = time.time() if now is None else now
    if verify_expiry and moment >= claims.expires_at + leeway_s:
        raise GrantError("grant expired")
    return claims


def _claims(payload: dict[str, Any]) -> GrantClaims:
    if payload["iss"] != GRANT_ISSUER or not isinstance(payload["exp"], int):
        raise ValueError("not a grant's claims")
    return GrantClaims(
        invocation_id=str(payload["jti"]),
        capability_id=str(payload["cap"]),
        capability_version=str(payload["ver"]),
        service=str(payload["svc"]),
        actor_id=str(payload["sub"]),
        input_digest=str(payload["dig"]),
        expires_at=payload["exp"],
    )
