"""Actor JWT verification: HS256 for development, RS256/ES256 from a key file
or a JWKS document for production."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from warden_server.auth.actors import ActorVerifier, AuthenticationError
from warden_server.config import ActorsSection


def claims(**extra: Any) -> dict[str, Any]:
    now = int(time.time())
    return {
        "sub": "alice",
        "roles": ["support"],
        "tenant": "acme",
        "iss": "idp",
        "aud": "warden",
        "iat": now,
        "exp": now + 300,
        **extra,
    }


def public_pem(key: Any) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


@pytest.fixture(params=["RS256", "ES256"])
def keypair(request: pytest.FixtureRequest) -> tuple[str, Any]:
    if request.param == "RS256":
        return "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return "ES256", ec.generate_private_key(ec.SECP256R1())


def verifier_for(tmp_path: Path, **section: Any) -> ActorVerifier:
    return ActorVerifier(ActorsSection(issuer="idp", audience="warden", **section), tmp_path)


def test_a_public_key_file_verifies_its_algorithm(tmp_path: Path, keypair: tuple[str, Any]) -> None:
    algorithm, key = keypair
    (tmp_path / "actors.pem").write_text(public_pem(key))
    verifier = verifier_for(tmp_path, public_key_file="actors.pem")
    actor = verifier.verify(jwt.encode(claims(desk="emea"), key, algorithm=algorithm))
    assert (actor.id, actor.roles, actor.tenant) == ("alice", ("support",), "acme")
    assert actor.attrs == {"desk": "emea"}


def test_a_token_signed_by_another_key_is_rejected(
    tmp_path: Path, keypair: tuple[str, Any]
) -> None:
    algorithm, key = keypair
    (tmp_path / "actors.pem").write_text(public_pem(key))
    verifier = verifier_for(tmp_path, public_key_file="actors.pem")
    stranger = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if algorithm == "RS256"
        else ec.generate_private_key(ec.SECP256R1())
    )
    with pytest.raises(AuthenticationError, match="signature"):
        verifier.verify(jwt.encode(claims(), stranger, algorithm=algorithm))


def test_an_hs256_token_keyed_with_the_public_key_is_refused(tmp_path: Path) -> None:
    # The classic algorithm-confusion attack: HMAC over the public key's bytes.
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = public_pem(key)
    (tmp_path / "actors.pem").write_text(pem)
    verifier = verifier_for(tmp_path, public_key_file="actors.pem")
    forged = jwt.encode(claims(), key=None, algorithm="none")
    with pytest.raises(AuthenticationError):
        verifier.verify(forged)
    header = jwt.utils.base64url_encode(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = jwt.utils.base64url_encode(json.dumps(claims()).encode())
    import hashlib
    import hmac

    signature = jwt.utils.base64url_encode(
        hmac.new(pem.encode(), header + b"." + payload, hashlib.sha256).digest()
    )
    with pytest.raises(AuthenticationError):
        verifier.verify((header + b"." + payload + b"." + signature).decode())


def test_a_jwks_file_picks_the_key_by_kid(tmp_path: Path) -> None:
    first = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    second = ec.generate_private_key(ec.SECP256R1())
    keys = []
    for kid, key, alg in (("k1", first, "RS256"), ("k2", second, "ES256")):
        jwk = json.loads(jwt.algorithms.get_default_algorithms()[alg].to_jwk(key.public_key()))
        keys.append({**jwk, "kid": kid, "alg": alg, "use": "sig"})
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": keys}))
    verifier = verifier_for(tmp_path, jwks_file="jwks.json")
    for kid, key, alg in (("k1", first, "RS256"), ("k2", second, "ES256")):
        token = jwt.encode(claims(), key, algorithm=alg, headers={"kid": kid})
        assert verifier.verify(token).id == "alice"
    wrong_kid = jwt.encode(claims(), first, algorithm="RS256", headers={"kid": "k2"})
    with pytest.raises(AuthenticationError):
        verifier.verify(wrong_kid)


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"iss": "someone-else"}, "issuer"),
        ({"aud": "another-audience"}, "(?i)audience"),
        ({"exp": int(time.time()) - 3600}, "expired"),
        ({"roles": "admin"}, "roles"),
        ({"sub": ""}, "subject"),
    ],
)
def test_claims_are_checked(tmp_path: Path, override: dict[str, Any], reason: str) -> None:
    verifier = verifier_for(tmp_path, hs256_secret="s" * 40)
    token = jwt.encode(claims(**override), "s" * 40, algorithm="HS256")
    with pytest.raises(AuthenticationError, match=reason):
        verifier.verify(token)


def test_a_token_without_expiry_is_refused(tmp_path: Path) -> None:
    verifier = verifier_for(tmp_path, hs256_secret="s" * 40)
    body = claims()
    del body["exp"]
    with pytest.raises(AuthenticationError, match="exp"):
        verifier.verify(jwt.encode(body, "s" * 40, algorithm="HS256"))


# -- verified tokens remembered ------------------------------------------------------


def counting_decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tokens whose signature is checked from here on."""
    checked: list[str] = []
    decode = jwt.decode

    def counted(token: str, *args: Any, **kwargs: Any) -> Any:
        checked.append(token)
        return decode(token, *args, **kwargs)

    monkeypatch.setattr("warden_server.auth.actors.jwt.decode", counted)
    return checked


def test_a_verified_token_is_remembered_until_it_expires_and_refused_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent sends the same token with every call: its signature is checked
    once, and the verification is trusted exactly as long as checking again
    would accept the token, not a moment past its ``exp``."""
    verifier = verifier_for(tmp_path, hs256_secret="s" * 40, leeway_seconds=0)
    checked = counting_decodes(monkeypatch)
    expires = int(time.time()) + 3
    token = jwt.encode(claims(exp=expires), "s" * 40, algorithm="HS256")
    assert [verifier.verify(token).id for _ in range(3)] == ["alice"] * 3
    assert checked == [token]
    while time.time() <= expires:
        time.sleep(0.05)
    with pytest.raises(AuthenticationError, match="expired"):
        verifier.verify(token)
    assert checked == [token, token], "an expired token was taken from memory"


def test_verified_tokens_are_remembered_within_a_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ActorVerifier, "CACHE_SIZE", 4)
    verifier = verifier_for(tmp_path, hs256_secret="s" * 40)
    tokens = [jwt.encode(claims(sub=f"agent-{n}"), "s" * 40, algorithm="HS256") for n in range(10)]
    assert [verifier.verify(t).id for t in tokens] == [f"agent-{n}" for n in range(10)]
    assert len(verifier._verified) <= 4
    # The newest are still remembered; the oldest are verified again, and pass.
    checked = counting_decodes(monkeypatch)
    assert verifier.verify(tokens[-1]).id == "agent-9" and checked == []
    assert verifier.verify(tokens[0]).id == "agent-0" and checked == [tokens[0]]
