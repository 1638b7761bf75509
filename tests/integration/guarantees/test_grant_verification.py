"""Verifiable grants: published keys with ids and rotation, and
``warden.verify_grant`` refusing anything but this capability, this input,
in time, under the plane's key."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel

import warden
from tests.conftest import ORDERS_TOKEN, Plant
from tests.integration.guarantees.lab import Ledger, build_payments
from warden.shared.canonical import digest
from warden.v1 import errors_pb2, governor_pb2, governor_pb2_grpc, grants_pb2, grants_pb2_grpc

SERVICE = (("x-warden-service-token", ORDERS_TOKEN),)


class ForwardIn(BaseModel):
    item: str
    qty: int


class ForwardOut(BaseModel):
    ok: bool


ARGUMENTS = {"order_id": "A1", "amount": 10, "card": {"number": "4111111111111111"}}


def write_key(path: Path, *, public: bool = False) -> Path:
    key = Ed25519PrivateKey.generate()
    if public:
        data = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    else:
        data = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    path.write_bytes(data)
    return path


def granted(plant: Plant, arguments: Any = ARGUMENTS) -> governor_pb2.BeginResponse:
    """A grant for orders.pay, taken straight from the plane."""
    rt = build_payments(plant.target, ORDERS_TOKEN, Ledger())
    try:
        rt.register()
    finally:
        rt.close()
    with grpc.insecure_channel(plant.target) as channel:
        response = governor_pb2_grpc.GovernorStub(channel).Begin(
            governor_pb2.BeginRequest(
                invocation_id=str(uuid.uuid4()),
                capability_id="orders.pay",
                actor_token=plant.token(sub="alice"),
                input_json=json.dumps(arguments),
            ),
            metadata=SERVICE,
        )
    assert response.WhichOneof("outcome") == "grant"
    return response


@pytest.fixture
def forwarded(
    pay_plant: Plant, ledger: Ledger
) -> tuple[warden.Envelope, str, list[warden.GrantKey]]:
    """A call whose handler passed its grant on, and the plane's keys."""
    seen: list[str] = []
    rt = build_payments(pay_plant.target, ORDERS_TOKEN, ledger)

    @rt.capability("orders.forward", input=ForwardIn, output=ForwardOut)
    def forward(inp: ForwardIn, ctx: warden.Context) -> ForwardOut:
        seen.append(ctx.grant_token)  # as a handler hands it to a downstream service
        return ForwardOut(ok=True)

    try:
        env = rt.invoke("orders.forward", {"item": "A1", "qty": 2}, actor=pay_plant.token())
        keys = rt.grant_keys()
    finally:
        rt.close()
    assert env.status == "succeeded"
    (token,) = seen
    return env, token, keys


def test_verify_grant_accepts_the_grant_for_this_capability_and_input(
    forwarded: tuple[warden.Envelope, str, list[warden.GrantKey]],
) -> None:
    env, token, keys = forwarded
    claims = warden.verify_grant(
        token, keys, capability_id="orders.forward", input={"qty": 2, "item": "A1"}
    )
    assert claims.invocation_id == env.invocation_id
    assert claims.actor_id == "bot-7" and claims.service == "orders"
    assert claims.input_digest == digest({"item": "A1", "qty": 2})
    by_digest = warden.verify_grant(
        token, keys, capability_id="orders.forward", input_digest=claims.input_digest
    )
    assert by_digest == claims


def test_verify_grant_fails_for_a_changed_input(
    forwarded: tuple[warden.Envelope, str, list[warden.GrantKey]],
) -> None:
    _, token, keys = forwarded
    with pytest.raises(warden.GrantVerificationError, match="another input"):
        warden.verify_grant(
            token, keys, capability_id="orders.forward", input={"item": "A1", "qty": 3}
        )
    with pytest.raises(warden.GrantVerificationError, match="another input"):
        warden.verify_grant(
            token, keys, capability_id="orders.forward", input_digest="sha256:" + "0" * 64
        )


def test_verify_grant_fails_for_another_capability(
    forwarded: tuple[warden.Envelope, str, list[warden.GrantKey]],
) -> None:
    _, token, keys = forwarded
    refused = r"for orders\.forward, not orders\.pay"
    with pytest.raises(warden.GrantVerificationError, match=refused):
        warden.verify_grant(token, keys, capability_id="orders.pay", input={"item": "A1", "qty": 2})


def test_verify_grant_fails_for_an_expired_grant(
    forwarded: tuple[warden.Envelope, str, list[warden.GrantKey]],
) -> None:
    _, token, keys = forwarded
    expires = jwt.decode(token, options={"verify_signature": False})["exp"]
    arguments = {"capability_id": "orders.forward", "input": {"item": "A1", "qty": 2}}
    warden.verify_grant(token, keys, now=expires - 1, **arguments)
    with pytest.raises(warden.GrantVerificationError, match="expired"):
        warden.verify_grant(token, keys, now=expires, **arguments)
    warden.verify_grant(token, keys, now=expires + 5, leeway_s=10, **arguments)


def test_verify_grant_fails_for_a_foreign_key(
    forwarded: tuple[warden.Envelope, str, list[warden.GrantKey]],
) -> None:
    _, token, keys = forwarded
    claims = jwt.decode(token, options={"verify_signature": False})
    header = jwt.get_unverified_header(token)
    foreign = Ed25519PrivateKey.generate()
    arguments = {"capability_id": "orders.forward", "input": {"item": "A1", "qty": 2}}
    # Signed by another key, naming it: unknown to the plane's key set.
    other = jwt.encode(claims, foreign, algorithm="EdDSA", headers={"kid": "someone-else"})
    with pytest.raises(warden.GrantVerificationError, match="unknown key"):
        warden.verify_grant(other, keys, **arguments)
    # Signed by another key, claiming the plane's key id: the signature fails.
    spoofed = jwt.encode(claims, foreign, algorithm="EdDSA", headers={"kid": header["kid"]})
    with pytest.raises(warden.GrantVerificationError, match="rejected"):
        warden.verify_grant(spoofed, keys, **arguments)
    # The genuine grant, checked against another plane's keys.
    pem = foreign.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(warden.GrantVerificationError, match="unknown key"):
        warden.verify_grant(token, {"someone-else": pem.decode()}, **arguments)


def test_verify_grant_needs_exactly_one_of_input_and_digest(
    forwarded: tuple[warden.Envelope, str, list[warden.GrantKey]],
) -> None:
    _, token, keys = forwarded
    with pytest.raises(ValueError, match="exactly one"):
        warden.verify_grant(token, keys, capability_id="orders.forward")


def test_verify_grant_names_the_key_that_is_not_a_key(
    forwarded: tuple[warden.Envelope, str, list[warden.GrantKey]],
) -> None:
    _, token, _ = forwarded
    broken = {"k-2026": "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"}
    with pytest.raises(ValueError, match=r"^grant key 'k-2026': "):
        warden.verify_grant(token, broken, capability_id="orders.forward", input={})


def test_grant_keys_are_public_and_name_the_signing_key(pay_plant: Plant) -> None:
    with grpc.insecure_channel(pay_plant.target) as channel:
        response = grants_pb2_grpc.GrantKeysStub(channel).ListGrantKeys(
            grants_pb2.ListGrantKeysRequest()
        )
    (key,) = response.keys
    assert key.signing and key.algorithm == "EdDSA"
    assert key.public_key_pem.startswith("-----BEGIN PUBLIC KEY-----")
    token = granted(pay_plant).grant.token
    assert jwt.get_unverified_header(token)["kid"] == key.key_id


def test_keys_rotate_without_breaking_grants_in_flight(
    launch: Callable[..., Plant], tmp_path: Path
) -> None:
    old_key = write_key(tmp_path / "old.pem")
    new_key = write_key(tmp_path / "new.pem")
    before = launch(grants={"signing_key_file": str(old_key)})
    in_flight = granted(before)
    before.server.stop(grace=0)

    # Rotated: the new key signs, the old one is still published and accepted.
    after = launch(
        grants={"signing_key_file": str(new_key), "verification_key_files": [str(old_key)]}
    )
    rt = warden.Runtime(after.target, service="orders", token=ORDERS_TOKEN)
    try:
        keys = rt.grant_keys()
    finally:
        rt.close()
    assert [k.signing for k in keys] == [True, False]
    fresh = granted(after)
    for response in (in_flight, fresh):
        warden.verify_grant(response.grant.token, keys, capability_id="orders.pay", input=ARGUMENTS)
    assert jwt.get_unverified_header(fresh.grant.token)["kid"] == keys[0].key_id
    assert jwt.get_unverified_header(in_flight.grant.token)["kid"] == keys[1].key_id

    # The grant issued before the rotation can still report its outcome.
    with grpc.insecure_channel(after.target) as channel:
        governor_pb2_grpc.GovernorStub(channel).Complete(
            governor_pb2.CompleteRequest(
                invocation_id=in_flight.invocation_id,
                grant_token=in_flight.grant.token,
                status=governor_pb2.OUTCOME_STATUS_CANCELLED,
                failure=errors_pb2.Failure(code="CANCELLED", stage="cancellation"),
            ),
            metadata=SERVICE,
        )
    (outcome,) = after.events(invocation_id=in_flight.invocation_id, kind="outcome")
    assert outcome["status"] == "cancelled"


def test_a_verification_key_file_that_is_not_ed25519_is_named(
    launch: Callable[..., Plant], tmp_path: Path
) -> None:
    bad = tmp_path / "not-a-key.pem"
    bad.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    with pytest.raises(ValueError, match=r"not-a-key\.pem: not an Ed25519 verification key"):
        launch(grants={"verification_key_files": [str(bad)]})


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("signing_key_file", "keys/nope.pem"),
        ("verification_key_files", ["keys/nope.pem"]),
    ],
)
def test_a_key_file_that_cannot_be_read_is_named_with_its_setting(
    launch: Callable[..., Plant], setting: str, value: object
) -> None:
    with pytest.raises(
        OSError, match=rf"nope\.pem: cannot read this key \(\[grants\] {setting}\): No such file"
    ):
        launch(grants={setting: value})


def test_grants_expire_by_the_clock_of_the_plane(pay_plant: Plant) -> None:
    response = granted(pay_plant)
    claims = jwt.decode(response.grant.token, options={"verify_signature": False})
    # The time budget (2 s) plus the grant ttl (60 s).
    assert abs(claims["exp"] - (time.time() + 62)) < 5


def test_verify_grant_takes_one_text_for_one_grant(
    forwarded: tuple[warden.Envelope, str, list[warden.GrantKey]],
) -> None:
    """A grant's text is the grant: a segment with characters base64url does
    not have, padding, or bits past its last byte (which a lenient decoder
    skips) is malformed, so a service that tracks grants by text is not led
    to take two texts for two grants."""
    _, token, keys = forwarded
    arguments = {"capability_id": "orders.forward", "input": {"item": "A1", "qty": 2}}
    assert warden.verify_grant(token, keys, **arguments).capability_id == "orders.forward"
    head, body, signature = token.split(".")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    # The signature's last character carries 2 bits of the last byte and 4 unused.
    spare = alphabet[alphabet.index(signature[-1]) ^ 1]
    for altered in (
        f"{token}!!",
        f"{head}.{body}.{signature[:10]} {signature[10:]}",
        f"{head}.{body}.{signature}==",
        f"{head}.{body}.{signature[:-1]}{spare}",
    ):
        with pytest.raises(warden.GrantVerificationError, match="not a well-formed JWT"):
            warden.verify_grant(altered, keys, **arguments)
