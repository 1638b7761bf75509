"""``warden token``: development actor tokens."""

from __future__ import annotations

import click

from warden_server.auth.actors import mint_token
from warden_server.cli.common import CONFIG_OPTION, load

RESERVED_CLAIMS = frozenset({"sub", "roles", "tenant", "iss", "aud", "iat", "exp", "nbf", "jti"})
"""Claims ``mint`` sets itself: an --attr of one would be overwritten in silence."""


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
@click.option(
    "--ttl",
    type=click.IntRange(min=1),
    default=3600,
    show_default=True,
    help="Lifetime in seconds.",
)
def token_mint(
    config_path: str,
    sub: str,
    roles: tuple[str, ...],
    tenant: str,
    attrs: tuple[str, ...],
    ttl: int,
) -> None:
    """Print a development JWT signed with the config's HS256 secret."""
    if not sub.strip():
        raise click.BadParameter("the actor id must not be empty", param_hint="--sub")
    claims: dict[str, str] = {}
    for item in attrs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--attr")
        if key in RESERVED_CLAIMS:
            raise click.BadParameter(
                f"{key!r} is a claim the token sets itself (use --sub, --role, --tenant or --ttl)",
                param_hint="--attr",
            )
        claims[key] = value
    config = load(config_path)
    try:
        click.echo(
            mint_token(
                config, subject=sub, roles=roles, tenant=tenant, attrs=claims, ttl_seconds=ttl
            )
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
