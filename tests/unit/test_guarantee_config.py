"""Configuration of idempotency, redaction, grant keys and the plane's deadline."""

from __future__ import annotations

import pytest

from warden_server.config import ConfigError, config_from_dict
from warden_server.sealing import Sealer

ACTORS = {"hs256_secret": "s" * 32}


def test_defaults() -> None:
    c = config_from_dict({"actors": ACTORS})
    assert c.idempotency.window_seconds == 24 * 3600
    assert c.idempotency.replay_key is None
    assert c.redaction.mode == "mask"
    assert c.server.request_deadline_ms == 5_000
    assert c.grants.verification_key_files == []


def test_secrets_come_from_the_environment() -> None:
    c = config_from_dict(
        {"actors": ACTORS, "redaction": {"mode": "keyed-hash"}},
        environ={
            "WARDEN_REDACTION_HASH_KEY": "k" * 16,
            "WARDEN_IDEMPOTENCY_REPLAY_KEY": "r" * 16,
        },
    )
    assert c.redaction.hash_key == "k" * 16
    assert c.idempotency.replay_key == "r" * 16
    assert "k" * 16 not in repr(c) and "r" * 16 not in repr(c)


def test_every_problem_is_named() -> None:
    with pytest.raises(ConfigError) as raised:
        config_from_dict(
            {
                "actors": ACTORS,
                "idempotency": {"window": "a day", "replay_key": "short"},
                "redaction": {"mode": "keyed-hash"},
                "server": {"request_deadline_ms": 0},
            }
        )
    message = str(raised.value)
    assert "idempotency: 'a day' is not a duration" in message
    assert "redaction: mode keyed-hash needs hash_key" in message
    assert "server.request_deadline_ms" in message


def test_a_short_replay_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="replay_key must be at least 16 characters"):
        config_from_dict({"actors": ACTORS, "idempotency": {"replay_key": "short"}})


def test_sealed_outputs_open_only_under_their_key_and_binding() -> None:
    sealer = Sealer.from_secret("replay-key-0123456789")
    sealed = sealer.seal('{"pan":"4111"}', "svc|cap|actor|key")
    assert b"4111" not in sealed
    assert sealer.open(sealed, "svc|cap|actor|key") == '{"pan":"4111"}'
    assert Sealer.from_secret("replay-key-0123456789").open(sealed, "svc|cap|actor|key")
    assert sealer.open(sealed, "svc|cap|actor|other") is None
    assert Sealer.from_secret("another-key-0123456789").open(sealed, "svc|cap|actor|key") is None
    assert Sealer.from_secret(None).open(sealed, "svc|cap|actor|key") is None
