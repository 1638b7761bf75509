"""Grant verification: tokens this plane signed are remembered, never trusted blindly."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from warden_server import grants
from warden_server.grants import GrantClaims, GrantError, GrantSigner


def claims(invocation: str = "inv-1", expires_in: float = 60) -> GrantClaims:
    return GrantClaims(
        invocation_id=invocation,
        capability_id="orders.refund",
        capability_version="1",
        service="orders",
        actor_id="bot-7",
        input_digest="d" * 64,
        expires_at=int(time.time() + expires_in),
    )


def test_a_remembered_grant_verifies_as_its_signature_would() -> None:
    key = Ed25519PrivateKey.generate()
    signer, stranger = GrantSigner(key), GrantSigner(key)
    token = signer.sign(claims())
    assert signer.verify(token) == stranger.verify(token) == claims()


def test_a_grant_that_differs_by_one_character_is_refused_though_its_original_is_remembered() -> (
    None
):
    signer = GrantSigner(Ed25519PrivateKey.generate())
    token = signer.sign(claims())
    head, payload, signature = token.split(".")
    forged = ".".join((head, payload, ("A" if signature[0] != "A" else "B") + signature[1:]))
    with pytest.raises(GrantError, match="bad signature"):
        signer.verify(forged)


def test_a_remembered_grant_past_its_expiry_is_refused_when_expiry_counts() -> None:
    signer = GrantSigner(Ed25519PrivateKey.generate())
    token = signer.sign(claims(expires_in=-1))
    with pytest.raises(GrantError, match="expired"):
        signer.verify(token)
    assert signer.verify(token, verify_expiry=False).invocation_id == "inv-1"


def test_remembered_grants_are_bounded_and_forgotten_ones_still_verify(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(grants, "ISSUED_REMEMBERED", 3)
    signer = GrantSigner(Ed25519PrivateKey.generate())
    tokens = [signer.sign(claims(f"inv-{i}")) for i in range(5)]
    assert len(signer._issued) == 3
    assert tokens[0] not in signer._issued
    assert [signer.verify(t).invocation_id for t in tokens] == [f"inv-{i}" for i in range(5)]
