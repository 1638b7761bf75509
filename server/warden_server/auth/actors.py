"""Actor authentication: verify a JWT and turn its claims into an Actor."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt

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


class ActorVerifier:
    """Verifies actor JWTs: HS256 with a shared secret, or RS256/ES256 with a
    public key file or a JWKS file."""

    def __init__(self, section: ActorsSection, base_dir: Path = Path()) -> None:
        self._issuer = section.issuer
        self._audience = section.audience
        self._leeway = section.leeway_seconds
        self._keys: dict[str | None, Any]
        if section.hs256_secret:
            self._algorithms: Sequence[str] = ["HS256"]
            self._keys = {None: section.hs256_secret}
        elif section.public_key_file:
            self._algorithms = ["RS256", "ES256"]
            self._keys = {None: (base_dir / section.public_key_file).read_text()}
        else:
            assert section.jwks_file
            document = json.loads((base_dir / section.jwks_file).read_text())
            keyset = jwt.PyJWKSet.from_dict(document)
            self._algorithms = ["RS256", "ES256"]
            self._keys = {key.key_id: key.key for key in keyset.keys}

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
        try:
            header = jwt.get_unverified_header(token)
            key = self._keys.get(header.get("kid")) or self._keys.get(None)
            if key is None:
                raise AuthenticationError(f"unknown key id {header.get('kid')!r}")
            claims = jwt.decode(
                token,
                key,
                algorithms=list(self._algorithms),
                issuer=self._issuer,
                audience=self._audience,
                leeway=self._leeway,
                options={"require": ["sub", "exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthenticationError("actor token expired") from None
        except jwt.InvalidSignatureError:
            raise AuthenticationError("actor token signature is invalid") from None
        except jwt.PyJWTError as exc:
            raise AuthenticationError(f"actor token rejected: {exc}") from None
        return _actor_from_claims(claims)


def _actor_from_claims(claims: Mapping[str, Any]) -> Actor:
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
