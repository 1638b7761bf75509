"""Actor authentication: verify a JWT and turn its claims into an Actor."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from warden_server.config import ActorsSection, Config

_RESERVED_CLAIMS = frozenset({"sub", "roles", "tenant", "iss", "aud", "exp", "iat", "nbf", "jti"})


class AuthenticationError(Exception):
    """The actor token is missing or not acceptable; the message says why
    (for the audit log and operators, never for a model)."""


@dataclass(frozen=True, slots=True)
class Actor:
    """A verified actor."""

    id: str
    roles: tuple[str, ...] = ()
    tenant: str = ""
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def to_cel(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "roles": list(self.roles),
            "tenant": self.tenant,
            "attrs": dict(self.attrs),
        }


@dataclass(frozen=True, slots=True)
class _VerificationKey:
    key: Any
    algorithm: str


class ActorVerifier:
    """Verifies actor JWTs: HS256 with a shared secret, or RS256/ES256 with a
    public key file or a JWKS file.

    Every key is bound to exactly one algorithm, so a token cannot choose how
    it is checked (no algorithm confusion, no ``alg: none``).
    """

    CACHE_SIZE = 10_000
    """Verified tokens remembered: an agent sends the same token with every call."""

    def __init__(self, section: ActorsSection, base_dir: Path = Path()) -> None:
        self._verified: dict[str, tuple[Actor, float]] = {}
        """Token -> (actor, when to stop trusting the verification): until ``exp``
        plus the leeway, exactly as long as verifying again would accept it."""
        self._lock = threading.Lock()
        self._issuer = section.issuer
        self._audience = section.audience
        self._leeway = section.leeway_seconds
        self._keys: dict[str | None, _VerificationKey]
        if section.hs256_secret:
            self._keys = {None: _VerificationKey(section.hs256_secret, "HS256")}
        elif section.public_key_file:
            path = base_dir / section.public_key_file
            self._keys = {None: _public_key(path)}
        else:
            assert section.jwks_file
            path = base_dir / section.jwks_file
            try:
                keyset = jwt.PyJWKSet.from_dict(json.loads(path.read_text()))
            except (ValueError, jwt.PyJWTError) as exc:
                raise ValueError(f"{path}: not a usable JWKS document: {exc}") from None
            self._keys = {
                key.key_id: _VerificationKey(key.key, key.algorithm_name) for key in keyset.keys
            }
            if len(self._keys) == 1:
                self._keys[None] = next(iter(self._keys.values()))

    @classmethod
    def from_config(cls, config: Config) -> ActorVerifier:
        return cls(config.actors, config.base_dir)

    def verify(self, token: str) -> Actor:
        """The actor the token names.

        Raises:
            AuthenticationError: no token, a bad signature, an expired token,
                the wrong issuer or audience, or missing claims.
        """
        if not token:
            raise AuthenticationError("no actor token")
        known = self._verified.get(token)
        if known is not None and time.time() <= known[1]:
            return known[0]
        actor, claims = self._verify(token)
        self._remember(token, actor, float(claims["exp"]) + self._leeway)
        return actor

    def _remember(self, token: str, actor: Actor, until: float) -> None:
        with self._lock:
            if len(self._verified) >= self.CACHE_SIZE:
                # Forget the older half (dicts keep insertion order): bounded
                # memory, and the tokens in use are soon verified again.
                for stale in list(self._verified)[: self.CACHE_SIZE // 2]:
                    del self._verified[stale]
            self._verified[token] = (actor, until)

    def _verify(self, token: str) -> tuple[Actor, Mapping[str, Any]]:
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            found = self._keys.get(kid) if kid is not None else self._keys.get(None)
            if found is None:
                raise AuthenticationError(f"unknown key id {kid!r}")
            claims = jwt.decode(
                token,
                found.key,
                algorithms=[found.algorithm],
                issuer=self._issuer,
                audience=self._audience,
                leeway=self._leeway,
                options={"require": ["sub", "exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthenticationError("actor token expired") from None
        except jwt.InvalidSignatureError:
            raise AuthenticationError("actor token signature is invalid") from None
        except jwt.MissingRequiredClaimError as exc:
            raise AuthenticationError(f"actor token rejected: no {exc.claim!r} claim") from None
        except (jwt.PyJWTError, ValueError, TypeError) as exc:
            # PyJWT's own words ("Not enough segments") describe its internals.
            reason = next(
                (words for kind, words in _REJECTIONS.items() if isinstance(exc, kind)),
                "not a valid JWT for this plane",
            )
            raise AuthenticationError(f"actor token rejected: {reason}") from None
        return actor_from_claims(claims), claims


_REJECTIONS: dict[type[Exception], str] = {
    jwt.DecodeError: "not a well-formed JWT",
    jwt.InvalidIssuerError: "issued by another issuer",
    jwt.InvalidAudienceError: "meant for another audience",
    jwt.ImmatureSignatureError: "not valid yet",
    jwt.InvalidAlgorithmError: "signed with an algorithm this key does not verify",
}
"""Why a token was refused, in the plane's words, by PyJWT's exception."""


def _public_key(path: Path) -> _VerificationKey:
    """A PEM public key and the one algorithm it verifies."""
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except ValueError as exc:
        raise ValueError(f"{path}: not a PEM public key: {exc}") from None
    if isinstance(key, rsa.RSAPublicKey):
        return _VerificationKey(key, "RS256")
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1":
        return _VerificationKey(key, "ES256")
    raise ValueError(f"{path}: actor keys must be RSA (RS256) or P-256 EC (ES256)")


def actor_from_claims(claims: Mapping[str, Any]) -> Actor:
    """The actor that verified claims describe.

    Raises:
        AuthenticationError: the claims do not describe an actor.
    """
    subject = claims.get("sub")
    roles = claims.get("roles", [])
    tenant = claims.get("tenant", "")
    if not isinstance(subject, str) or not subject:
        raise AuthenticationError("actor token has no subject")
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise AuthenticationError("actor token claim 'roles' must be a list of strings")
    if not isinstance(tenant, str):
        raise AuthenticationError("actor token claim 'tenant' must be a string")
    attrs = {k: v for k, v in claims.items() if k not in _RESERVED_CLAIMS}
    return Actor(id=subject, roles=tuple(roles), tenant=tenant, attrs=attrs)


def mint_token(
    config: Config,
    *,
    subject: str,
    roles: Sequence[str] = (),
    tenant: str = "",
    attrs: Mapping[str, Any] | None = None,
    ttl_seconds: int = 3600,
    now: float | None = None,
) -> str:
    """A development actor JWT signed with the configured HS256 secret.

    Raises:
        ValueError: the config verifies actors with public keys; mint those
            tokens with your identity provider.
    """
    secret = config.actors.hs256_secret
    if not secret:
        raise ValueError("token mint needs [actors] hs256_secret: it signs development tokens only")
    issued = int(now if now is not None else time.time())
    claims: dict[str, Any] = dict(attrs or {})
    claims.update(
        sub=subject,
        roles=list(roles),
        tenant=tenant,
        iss=config.actors.issuer,
        aud=config.actors.audience,
        iat=issued,
        exp=issued + ttl_seconds,
    )
    return jwt.encode(claims, secret, algorithm="HS256")
