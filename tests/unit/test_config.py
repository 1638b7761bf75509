"""Configuration: warden.toml sections, secrets from the environment argument,
command-line overrides, and errors that name the problem."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from warden_server.config import ConfigError, config_from_dict, load_config

SECRET = "s" * 32

ROOT = Path(__file__).resolve().parents[2]

VALID_TOML = """\
[server]
listen = "127.0.0.1:6000"
store = "var/test.db"
policies = "rules"
default_effect = "allow"

[actors]
hs256_secret = "file-secret-0123456789abcdef-0123"
issuer = "iss"
audience = "aud"

[services.orders]
token = "file-orders-token"
namespaces = ["orders"]

[services.billing]
token_sha256 = "{digest}"
namespaces = ["billing", "payments.cards"]
""".format(digest=hashlib.sha256(b"billing-token").hexdigest())


def write_config(tmp_path: Path, text: str = VALID_TOML, name: str = "warden.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def minimal(**services: dict[str, Any]) -> dict[str, Any]:
    return {"actors": {"hs256_secret": "s" * 32}, "services": services}


def config_error(data: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data, **kw)
    return str(caught.value)


def test_valid_config_loads(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path), environ={})
    assert config.server.listen == "127.0.0.1:6000"
    assert config.server.default_effect == "allow"
    assert config.actors.hs256_secret == "file-secret-0123456789abcdef-0123"
    assert (config.actors.issuer, config.actors.audience) == ("iss", "aud")
    assert config.services["orders"].token == "file-orders-token"
    assert (
        config.services["orders"].token_digest == hashlib.sha256(b"file-orders-token").hexdigest()
    )
    assert config.services["billing"].token_digest == hashlib.sha256(b"billing-token").hexdigest()
    assert config.services["billing"].namespaces == ["billing", "payments.cards"]


def test_defaults_fail_closed() -> None:
    config = config_from_dict(minimal())
    assert config.server.default_effect == "deny"
    assert config.server.listen == "127.0.0.1:50051"


# -- rejected configurations --------------------------------------------------


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"server": {"colour": "red"}, "actors": {"hs256_secret": "s" * 32}}, "server.colour"),
        ({"actors": {"hs256_secret": "s" * 32, "isuer": "x"}}, "actors.isuer"),
        ({"grants": {"ttl": 5}, "actors": {"hs256_secret": "s" * 32}}, "grants.ttl"),
        (
            minimal(orders={"token": "t", "namespaces": ["orders"], "tokn": "x"}),
            "services.orders.tokn",
        ),
    ],
)
def test_unknown_key_names_its_path(data: dict[str, Any], path: str) -> None:
    message = config_error(data, source="my.toml")
    assert message.startswith("my.toml: invalid configuration:")
    assert f"  {path}: unknown setting" in message


@pytest.mark.parametrize(
    "service",
    [
        {"namespaces": ["orders"]},
        {"namespaces": ["orders"], "token": "t", "token_sha256": "a" * 64},
    ],
    ids=["neither", "both"],
)
def test_exactly_one_of_token_and_token_sha256(service: dict[str, Any]) -> None:
    message = config_error(minimal(orders=service))
    assert "services.orders: set exactly one of token or token_sha256" in message
    assert "WARDEN_SERVICE_<NAME>_TOKEN" in message  # where else a token may come from


def test_token_sha256_must_be_a_hex_digest() -> None:
    message = config_error(minimal(orders={"namespaces": ["orders"], "token_sha256": "ABC"}))
    assert "token_sha256 must be 64 lowercase hex digits" in message


@pytest.mark.parametrize(
    ("first", "second"),
    [("orders", "orders"), ("orders", "orders.admin"), ("orders.admin", "orders")],
)
def test_overlapping_namespaces_between_services_rejected(first: str, second: str) -> None:
    message = config_error(
        minimal(
            orders={"token": "a", "namespaces": [first]},
            billing={"token": "b", "namespaces": [second]},
        )
    )
    assert "overlaps" in message
    assert "'orders'" in message and "'billing'" in message


def test_disjoint_namespaces_with_a_common_prefix_are_fine() -> None:
    config = config_from_dict(
        minimal(
            orders={"token": "a", "namespaces": ["orders"]},
            billing={"token": "b", "namespaces": ["orderservice"]},
        )
    )
    assert set(config.services) == {"orders", "billing"}


def test_actors_need_exactly_one_key_source() -> None:
    assert "set exactly one of hs256_secret" in config_error({"actors": {}})
    both = {"actors": {"hs256_secret": "s" * 32, "jwks_file": "k.json"}}
    assert "set exactly one of hs256_secret" in config_error(both)


# -- environment and overrides ------------------------------------------------


def test_environment_secrets_override_the_file(tmp_path: Path) -> None:
    environ = {
        "WARDEN_ACTORS_HS256_SECRET": "env-secret-0123456789abcdef-01234",
        "WARDEN_SERVICE_ORDERS_TOKEN": "env-orders-token",
        "WARDEN_SERVICE_BILLING_TOKEN": "env-billing-token",
    }
    config = load_config(write_config(tmp_path), environ=environ)
    assert config.actors.hs256_secret == "env-secret-0123456789abcdef-01234"
    assert config.services["orders"].token == "env-orders-token"
    # An environment token replaces a file digest, too.
    billing = config.services["billing"]
    assert (billing.token, billing.token_sha256) == ("env-billing-token", None)
    assert billing.token_digest == hashlib.sha256(b"env-billing-token").hexdigest()


@pytest.mark.parametrize("secret", ["short", "x" * 31])
def test_an_hs256_secret_shorter_than_256_bits_is_refused(secret: str) -> None:
    """A short secret can be guessed from one token it signed (RFC 7518 3.2)."""
    message = config_error({"actors": {"hs256_secret": secret}})
    assert f"actors.hs256_secret: the secret is {len(secret)} bytes; an HS256 secret" in message
    assert "at least 32" in message


def test_environment_supplies_a_missing_secret() -> None:
    config = config_from_dict(
        {"services": {"orders": {"namespaces": ["orders"]}}},
        environ={"WARDEN_ACTORS_HS256_SECRET": "e" * 32, "WARDEN_SERVICE_ORDERS_TOKEN": "t"},
    )
    assert config.actors.hs256_secret == "e" * 32
    assert config.services["orders"].token == "t"


def test_hyphenated_service_name_environment_key() -> None:
    config = config_from_dict(
        minimal(**{"order-svc": {"namespaces": ["orders"]}}),
        environ={"WARDEN_SERVICE_ORDER_SVC_TOKEN": "t"},
    )
    assert config.services["order-svc"].token == "t"


def test_environment_is_only_read_from_the_argument(tmp_path: Path) -> None:
    """Without ``environ`` the file's values stand (os.environ is not consulted)."""
    config = load_config(write_config(tmp_path))
    assert config.actors.hs256_secret == "file-secret-0123456789abcdef-0123"


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    overrides = {"listen": "0.0.0.0:7000", "store": "/abs/other.db", "policies": None}
    config = load_config(write_config(tmp_path), environ={}, overrides=overrides)
    assert config.server.listen == "0.0.0.0:7000"
    assert config.store_path == Path("/abs/other.db")
    assert config.server.policies == "rules", "a None override leaves the file's value"


def test_overrides_apply_without_a_server_section() -> None:
    config = config_from_dict(minimal(), overrides={"policies": "elsewhere"})
    assert config.server.policies == "elsewhere"


# -- files --------------------------------------------------------------------


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert str(caught.value) == f"{path}: no such config file"


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, "[server\nlisten = 1\n", name="broken.toml")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert str(caught.value).startswith(f"{path}:1:8: ")


def test_invalid_values_name_the_file(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        '[actors]\nhs256_secret = "ssssssssssssssssssssssssssssssss"\n[server]\nworkers = 0\n',
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert str(caught.value).startswith(f"{path}: invalid configuration:")
    assert "server.workers" in str(caught.value)


def test_each_problem_in_the_file_names_its_line(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        "# the plane\n"
        "[server]\n"
        'processes = "two"\n'
        "procesess = 2\n"
        "\n"
        "[actors]\n"
        'hs256_secret = "ssssssssssssssssssssssssssssssss"\n'
        "\n"
        '[services."orders"]\n'
        'namespaces = [\n  "orders",\n]\n'
        'tokn = "t"\n'
        "\n"
        "[[notifications.webhooks]]\n"
        'url = "https://hooks.example/a"\n'
        'secret = "dev-only-webhook-secret"\n'
        "[[notifications.webhooks]]\n"
        'url = "https://hooks.example/b"\n'
        'secret = "short"\n',
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    problems = str(caught.value).splitlines()
    assert problems[0] == f"{path}: invalid configuration:"
    assert sorted(problems[1:]) == sorted(
        [
            f"  {path}:3: server.processes: Input should be a valid integer, unable to parse "
            "string as an integer",
            f"  {path}:4: server.procesess: unknown setting (did you mean 'processes'?)",
            f"  {path}:13: services.orders.tokn: unknown setting (did you mean 'token'?)",
            f"  {path}:20: notifications.webhooks.1.secret: String should have at least 16 "
            "characters",
        ]
    )


def test_a_value_not_from_the_file_says_where_it_came_from(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        '[actors]\nhs256_secret = "ssssssssssssssssssssssssssssssss"\n[server]\nworkers = 4\n',
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={}, overrides={"workers": "none"})
    assert "  server.workers: Input should be a valid integer" in str(caught.value)
    assert str(caught.value).endswith("(from the command line)")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={"WARDEN_IDEMPOTENCY_REPLAY_KEY": "short"})
    assert str(caught.value).endswith(
        "  idempotency: replay_key must be at least 16 characters "
        "(from WARDEN_IDEMPOTENCY_REPLAY_KEY)"
    )
    in_file = write_config(
        tmp_path,
        f'[actors]\nhs256_secret = "{SECRET}"\n[idempotency]\nreplay_key = "x"\n',
    )
    with pytest.raises(ConfigError) as caught:
        load_config(in_file, environ={})
    assert f"  {in_file}:4: idempotency: replay_key must be at least 16" in str(caught.value)


def test_a_toml_syntax_error_names_its_line_and_column(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        '[actors]\nhs256_secret = "ssssssssssssssssssssssssssssssss"\n[server\n',
        name="broken.toml",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert str(caught.value) == f"{path}:3:8: Expected ']' at the end of a table declaration"


def test_relative_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    config = load_config(write_config(folder), environ={})
    assert config.base_dir == folder
    assert config.store_path == folder / "var" / "test.db"
    assert config.policies_path == folder / "rules"
    assert config.path("/etc/absolute") == Path("/etc/absolute")


def test_repository_warden_toml_loads() -> None:
    config = load_config(ROOT / "warden.toml", environ={})
    assert config.server.listen == "127.0.0.1:50051"
    assert config.server.default_effect == "deny"
    assert config.policies_path == ROOT / "policies"
    assert config.services["orders"].namespaces == ["orders"]
    assert config.actors.hs256_secret


def test_webhook_notifications_on_a_postgresql_store_are_a_clear_error() -> None:
    hook = {"url": "https://hooks.example/approvals", "secret": "s" * 16}
    data = {**minimal(), "notifications": {"webhooks": [hook]}}
    data["server"] = {"store": "postgresql://warden@db/warden"}
    message = config_error(data)
    assert "[notifications] webhooks need the SQLite store for now" in message
    data["server"] = {"store": "var/warden.db"}
    assert config_from_dict(data).notifications.webhooks[0].url == hook["url"]


@pytest.mark.parametrize("value", ["off", "", " off "])
def test_metrics_listen_off_in_the_file_serves_none_as_the_flag_does(
    tmp_path: Path, value: str
) -> None:
    text = VALID_TOML + f'\n[telemetry]\nmetrics_listen = "{value}"\n'
    config = load_config(write_config(tmp_path, text), environ={})
    assert config.telemetry.metrics_listen is None


@pytest.mark.parametrize(
    ("ttl", "message"),
    [
        ("1 hour", "'1 hour' is not a duration like 90s, 30m, 1h or 7d"),
        ("0m", "'0m': an approval request open for no time expires at once"),
        ("40000d", "'40000d' is longer than the longest duration, 36500d"),
    ],
)
def test_an_approval_ttl_that_is_no_duration_is_refused_at_its_line(
    tmp_path: Path, ttl: str, message: str
) -> None:
    """Read only when a rule first asks for approval, it failed that call
    (and every one after) instead of the plane's start."""
    path = write_config(
        tmp_path, f'[actors]\nhs256_secret = "{SECRET}"\n[server]\napproval_ttl = "{ttl}"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert f"  {path}:4: server.approval_ttl: {message}" in str(caught.value)
