"""``warden token``: development actor tokens."""

from __future__ import annotations

import click

from warden_server.auth.actors import mint_token
from warden_server.cli.common import CONFIG_OPTION, load


@click.group()
def token() -> None:
    """Development actor tokens."""


@token.command("mint")
@CONFIG_OPTION
@click.option("--sub", required=True, help="The actor id (JWT subject).")
@click.option("--role", "roles", multiple=True, help="A role; repeat for several.")
@click.option("--tenant", default="", help="The actor's tenant.")
@click.option(
    "--attr",
    "attrs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A free attribute claim; repeat for several.",
)
@click.option("--ttl", default=3600, show_default=True, help="Lifetime in seconds.")
def token_mint(
    config_path: str,
    sub: str,
    roles: tuple[str, ...],
    tenant: str,
    attrs: tuple[str, ...],
    ttl: int,
) -> None:
    """Print a development JWT signed with the config's HS256 secret."""
    config = load(config_path)
    claims: dict[str, str] = {}
    for item in attrs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--attr")
        claims[key] = value
    try:
        click.echo(
            mint_token(
                config, subject=sub, roles=roles, tenant=tenant, attrs=claims, ttl_seconds=ttl
            )
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
