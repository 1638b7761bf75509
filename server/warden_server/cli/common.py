"""What the commands share: the --config and --target options, and one clear
message for a config error, a store that cannot be opened or a plane that
refused or never answered."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from warden_server.config import STORE_SCHEMES, Config, ConfigError, load_config

if TYPE_CHECKING:
    import grpc

    from warden_server.store import SQLiteStore, Store

# gRPC, the SDK and the stores are imported by the functions that use them:
# `warden serve` reads its config with this module before it imports the
# plane, and starts its other processes meanwhile (serve.py).

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default="warden.toml",
    show_default=True,
    help="The plane's TOML configuration.",
)
STORE_OPTION = click.option(
    "--store", help="The SQLite store file or postgresql:// URL (default: the config's)."
)
DEFAULT_TARGET = "127.0.0.1:50051"


def required_token(
    _context: click.Context | None, _param: click.Parameter | None, value: str | None
) -> str:
    """``--token``, which may come from WARDEN_TOKEN: click's own "Missing
    option" would not say so."""
    if not value:
        raise click.UsageError("no token: give a JWT with --token, or set WARDEN_TOKEN")
    return value


def checked_target(
    _context: click.Context | None, _param: click.Parameter | None, value: str | None
) -> str | None:
    """``--target`` as HOST:PORT (or a ``unix:`` path); gRPC would quietly take
    port 99999 as another port."""
    if value is None or value.startswith("unix:"):
        return value
    if "://" in value:
        raise click.BadParameter(
            f"{value!r} is not HOST:PORT: give the address without a scheme "
            "(TLS comes from WARDEN_TLS_CA_FILE)"
        )
    host, colon, port = value.rpartition(":")
    if not (colon and host and port.isdigit() and 0 < int(port) < 65_536):
        raise click.BadParameter(f"{value!r} is not HOST:PORT with a port from 1 to 65535")
    return value


TARGET_OPTION = click.option(
    "--target",
    default=DEFAULT_TARGET,
    show_default=True,
    envvar="WARDEN_TARGET",
    callback=checked_target,
    help="The plane's host:port (or set WARDEN_TARGET).",
)


def load(path: str, **overrides: str | None) -> Config:
    """The config at ``path`` with secrets from the environment, or a ClickException."""
    try:
        return load_config(path, environ=os.environ, overrides=overrides)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def open_store(config_path: str, store: str | None) -> Store:
    """The store named by --store, else by the config; it must exist."""
    if store is not None and store.split(":", 1)[0] in STORE_SCHEMES:
        return _open_postgres(store, load(config_path).store_path)
    if store is None:
        config = load(config_path)
        if config.store_url is not None:
            return _open_postgres(config.store_url, config.store_path)
    return open_store_file(Path(store) if store else load(config_path).store_path)


def _open_postgres(url: str, files: Path) -> Store:
    from warden_server.store import StoreError
    from warden_server.store import open_store as connect_store

    try:
        return connect_store(url, files)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None


def check_store_file(path: Path) -> None:
    """Fail with one line unless ``path`` is a file: a command that reads a
    store never makes one, and a folder is not a damaged store. A SQLite
    database that no plane made (no Warden schema in it) is refused before
    anything writes to it: opening it as a store would add Warden's tables
    and key files to someone else's database. A file SQLite cannot read at
    all is left to the caller (``verify`` calls it damaged)."""
    if not path.exists():
        raise click.ClickException(f"{path}: no such store")
    if path.is_dir():
        raise click.ClickException(f"{path}: not a store: it is a folder, not a file")
    from warden_server.store.sqlite import made_by_a_plane

    if made_by_a_plane(path) is False:
        raise click.ClickException(
            f"{path}: not a Warden store: a SQLite database with no Warden schema in it "
            "(give the store file a plane serves, [server] store)"
        )


def open_store_file(path: Path) -> SQLiteStore:
    """The store at ``path``; it must exist."""
    from warden_server.store import SQLiteStore, StoreError

    check_store_file(path)
    try:
        return SQLiteStore(path)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None


def tls_credentials() -> grpc.ChannelCredentials | None:
    """TLS for ``--target`` connections, from WARDEN_TLS_CA_FILE, WARDEN_TLS_CERT_FILE
    and WARDEN_TLS_KEY_FILE; None (plaintext) when none is set."""
    from warden.shared.tls import TLS, TLSConfigError, credentials_of

    try:
        return credentials_of(TLS.from_environ(os.environ))
    except TLSConfigError as exc:
        raise click.ClickException(str(exc)) from None


def plane_refused(target: str, status: str, message: str) -> click.ClickException:
    """What a plane at ``target`` answered, or that no plane answered there.

    Every command words both the same way: ``no plane at TARGET: why`` when
    the call reached none, else ``TARGET answered STATUS: message``.
    """
    from warden.shared.reach import NO_PLANE

    if message.startswith(NO_PLANE):
        return click.ClickException(message)
    return click.ClickException(f"{target} answered {status}: {message}")


def rpc_refused(target: str, exc: grpc.RpcError) -> click.ClickException:
    """``plane_refused`` for a failed gRPC call."""
    import grpc

    from warden.shared.reach import unreachable

    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    message = unreachable(target, code, details) or details
    return plane_refused(target, code.name if code is not None else "ERROR", message)
