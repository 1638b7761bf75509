"""Grant verification: tokens this plane signed are remembered, never trusted blindly."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from warden.shared import grant_token
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


def test_a_grant_another_process_signed_with_the_key_verifies_as_decoding_it_would() -> None:
    key = Ed25519PrivateKey.generate()
    token = GrantSigner(key).sign(claims())
    other = GrantSigner(key)  # another process: it remembers nothing it did not sign
    assert grant_token.signed_as(token, key, kid=other.key_id) == claims()
    assert other.verify(token) == grant_token.decode(token, {other.key_id: key.public_key()})


def test_only_a_grant_byte_for_byte_as_the_key_signs_it_passes_for_signed_again() -> None:
    key = Ed25519PrivateKey.generate()
    signer = GrantSigner(key)
    token = signer.sign(claims())
    head, payload, signature = token.split(".")
    other_payload = GrantSigner(key).sign(claims("inv-2")).split(".")[1]
    foreign = GrantSigner(Ed25519PrivateKey.generate()).sign(claims())
    for changed in (
        ".".join((head, other_payload, signature)),  # claims swapped under a signature
        ".".join((head, payload, signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB"))),
        ".".join((head, payload + "=", signature)),
        foreign,
    ):
        assert grant_token.signed_as(changed, key, kid=signer.key_id) is None
        with pytest.raises(GrantError):
            GrantSigner(key).verify(changed)


def test_a_grant_signed_by_a_rotated_out_key_still_verifies_by_decoding() -> None:
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    token = GrantSigner(old).sign(claims())
    rotated = GrantSigner(new, [old.public_key()])
    assert grant_token.signed_as(token, new, kid=rotated.key_id) is None
    assert rotated.verify(token) == claims()


def test_a_grant_another_process_signed_past_its_expiry_is_refused() -> None:
    key = Ed25519PrivateKey.generate()
    token = GrantSigner(key).sign(claims(expires_in=-1))
    with pytest.raises(GrantError, match="expired"):
        GrantSigner(key).verify(token)
    assert GrantSigner(key).verify(token, verify_expiry=False).invocation_id == "inv-1"
