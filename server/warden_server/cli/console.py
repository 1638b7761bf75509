"""``warden console``: serve the web console for approvers and security teams."""

from __future__ import annotations

import os

import click

from warden.shared.tls import TLS, TLSConfigError
from warden_server.cli.common import CONFIG_OPTION, checked_target, load
from warden_server.console import ConsoleConfigError, bind, console_of, run


@click.command("console")
@CONFIG_OPTION
@click.option("--listen", help="host:port to serve on (default: [console] listen, 127.0.0.1:8080).")
@click.option(
    "--target",
    metavar="HOST:PORT",
    callback=checked_target,
    help="The plane (default: [console] target, else [server] listen).",
)
def console(config_path: str, listen: str | None, target: str | None) -> None:
    """Serve the web console: approvals inbox, audit explorer, policy status.

    People sign in with their own actor JWT (pasted, or from [console]
    token_header set by an authenticating proxy); every page asks the plane
    through its gRPC APIs with that token. TLS to the plane comes from
    WARDEN_TLS_CA_FILE, WARDEN_TLS_CERT_FILE and WARDEN_TLS_KEY_FILE.
    """
    config = load(config_path)
    try:
        tls = TLS.from_environ(os.environ)
    except TLSConfigError as exc:
        raise click.ClickException(str(exc)) from None
    address = listen or config.console.listen
    try:
        sock = bind(address)
    except ConsoleConfigError as exc:
        raise click.ClickException(str(exc)) from None
    state = console_of(config, target=target, tls=tls)
    scheme = "https" if config.console.tls_cert_file else "http"
    click.echo(
        f"console on {scheme}://{address}, asking the plane at {state.plane.target}", err=True
    )
    try:
        run(config, state, sock)
    except ConsoleConfigError as exc:
        raise click.ClickException(str(exc)) from None
