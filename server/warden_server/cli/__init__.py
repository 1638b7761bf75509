"""``warden``: a thin click layer over the plane's library.

Each command group lives in its own module. Domain errors become
``click.ClickException`` here, at the edge, and nowhere else.

A command's module is imported when that command runs, not before: the
plane's library takes most of a second to import, and ``warden serve``
starts its other processes while it imports the rest (``serve.py``).
"""

from __future__ import annotations

import importlib

import click

COMMANDS = {
    "serve": "warden_server.cli.serve:serve",
    "token": "warden_server.cli.token:token",
    "policy": "warden_server.cli.policy:policy",
    "audit": "warden_server.cli.audit:audit",
    "approvals": "warden_server.cli.approvals:approvals",
    "console": "warden_server.cli.console:console",
    "limits": "warden_server.cli.limits:limits",
}
"""Each command's name, and where it is defined (``module:attribute``)."""


class _Commands(click.Group):
    """The commands of ``COMMANDS``, each imported when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, _, attribute = COMMANDS[cmd_name].partition(":")
            command: click.Command = getattr(importlib.import_module(module), attribute)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=_Commands)
@click.version_option(package_name="warden")
def main() -> None:
    """Warden: a policy-as-code governance plane for the operations AI models may call."""


__all__ = ["main"]
