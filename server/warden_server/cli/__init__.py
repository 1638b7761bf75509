"""``warden``: a thin click layer over the plane's library.

Each command group lives in its own module. Domain errors become
``click.ClickException`` here, at the edge, and nowhere else.
"""

from __future__ import annotations

import click

from warden_server.cli.approvals import approvals
from warden_server.cli.audit import audit
from warden_server.cli.audit_tail import audit_tail
from warden_server.cli.console import console
from warden_server.cli.limits import limits
from warden_server.cli.policy import policy
from warden_server.cli.serve import serve
from warden_server.cli.token import token


@click.group()
@click.version_option(package_name="warden")
def main() -> None:
    """Warden: a policy-as-code governance plane for the operations AI models may call."""


for command in (serve, token, policy, audit, approvals, console, limits):
    main.add_command(command)
audit.add_command(audit_tail)

__all__ = ["main"]
