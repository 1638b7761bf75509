"""What the commands share: the --config option and turning config errors into
one clear message."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import click
import grpc

from warden.shared.tls import TLS, TLSConfigError, credentials_of
from warden_server.config import Config, ConfigError, load_config
from warden_server.store import SQLiteStore

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default="warden.toml",
    show_default=True,
    help="The plane's TOML configuration.",
)
STORE_OPTION = click.option("--store", help="The SQLite store (default: the config's).")


def load(path: str, **overrides: str | None) -> Config:
    """The config at ``path`` with secrets from the environment, or a ClickException."""
    try:
        return load_config(path, environ=os.environ, overrides=overrides)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def open_store(config_path: str, store: str | None) -> SQLiteStore:
    """The store named by --store, else by the config; it must exist."""
    path = Path(store) if store else load(config_path).store_path
    if not path.exists():
        raise click.ClickException(f"{path}: no such store")
    try:
        return SQLiteStore(path)
    except sqlite3.DatabaseError as exc:
        raise click.ClickException(f"{path}: not a Warden store ({exc})") from None


def tls_credentials() -> grpc.ChannelCredentials | None:
    """TLS for ``--target`` connections, from WARDEN_TLS_CA_FILE, WARDEN_TLS_CERT_FILE
    and WARDEN_TLS_KEY_FILE; None (plaintext) when none is set."""
    try:
        return credentials_of(TLS.from_environ(os.environ))
    except TLSConfigError as exc:
        raise click.ClickException(str(exc)) from None
