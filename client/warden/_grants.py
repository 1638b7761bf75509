"""Verifying grants without calling the plane.

A handler can pass its grant (``ctx.grant_token``) to a downstream service;
that service checks, with the plane's published keys, that this exact call —
this capability, this input — was authorized and is not stale.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from warden.shared import grant_token
from warden.shared.canonical import digest
from warden.shared.grant_token import GrantClaims, GrantError


class GrantVerificationError(Exception):
    """A grant does not authorize what it was presented for; the message says why."""


@dataclass(frozen=True, slots=True)
class GrantKey:
    """A public key that signs grants, as the plane publishes it."""

    key_id: str
    public_key_pem: str
    signing: bool = False
    """Whether the plane signs new grants with it (others are kept for rotation)."""


def verify_grant(
    token: str,
    keys: Iterable[GrantKey] | Mapping[str, str],
    *,
    capability_id: str,
    input: Any = None,
    input_digest: str | None = None,
    now: float | None = None,
    leeway_s: float = 0,
) -> GrantClaims:
    """Check that ``token`` authorizes running ``capability_id`` on this input.

    Args:
        token: The grant (a handler has it as ``ctx.grant_token``).
        keys: The plane's keys (``Runtime.grant_keys()``), or a mapping from
            key id to PEM public key.
        capability_id: The capability the grant must be for.
        input: The arguments the grant must be for (their RFC 8785 digest is
            compared), or give ``input_digest`` instead.
        input_digest: ``sha256:<hex>`` of the canonical input.
        now: The time to check expiry at (seconds since the epoch); now by default.
        leeway_s: Clock skew tolerated on expiry.

    Returns:
        The grant's claims (invocation id, actor, capability version, ...).

    Raises:
        GrantVerificationError: forged, signed by a key not in ``keys``,
            expired, or for another capability or input.
        ValueError: neither or both of ``input`` and ``input_digest`` given,
            or a key that is not an Ed25519 public key.
    """
    if (input is None) == (input_digest is None):
        raise ValueError("give exactly one of input and input_digest")
    expected = input_digest if input_digest is not None else digest(input)
    try:
        claims = grant_token.decode(token, _public_keys(keys), now=now, leeway_s=leeway_s)
    except GrantError as exc:
        raise GrantVerificationError(str(exc)) from None
    if claims.capability_id != capability_id:
        raise GrantVerificationError(
            f"the grant is for {claims.capability_id}, not {capability_id}"
        )
    if claims.input_digest != expected:
        raise GrantVerificationError("the grant is for another input")
    return claims


def _public_keys(keys: Iterable[GrantKey] | Mapping[str, str]) -> dict[str, Ed25519PublicKey]:
    pairs = (
        keys.items() if isinstance(keys, Mapping) else ((k.key_id, k.public_key_pem) for k in keys)
    )
    loaded = {}
    for kid, pem in pairs:
        try:
            loaded[kid] = grant_token.load_public_key(pem)
        except ValueError as exc:
            raise ValueError(f"grant key {kid!r}: {exc}") from None
    return loaded
