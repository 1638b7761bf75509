"""``warden``: a thin click layer over the plane's library.

Each command group lives in its own module. Domain errors become
``click.ClickException`` here, at the edge, and nowhere else.

A command's module is imported when that command runs, not before: the
plane's library takes most of a second to import, and ``warden serve``
starts its other processes while it imports the rest (``serve.py``).
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

import click


class Entry(NamedTuple):
    """A command of ``warden``: where it is defined, and its line in the help."""

    target: str
    """``module:attribute``"""
    summary: str
    """The first sentence of the command's own help (a test holds them together)."""


COMMANDS = {
    "serve": Entry("warden_server.cli.serve:serve", "Serve the plane until interrupted."),
    "token": Entry("warden_server.cli.token:token", "Development actor tokens."),
    "policy": Entry("warden_server.cli.policy:policy", "Check, test and inspect policy files."),
    "audit": Entry(
        "warden_server.cli.audit:audit", "Query, count, verify, export and prune the audit log."
    ),
    "approvals": Entry(
        "warden_server.cli.approvals:approvals",
        "List, show, approve and deny approvals (as the approver the token names).",
    ),
    "console": Entry(
        "warden_server.cli.console:console",
        "Serve the web console: approvals inbox, audit explorer, policy status.",
    ),
    "limits": Entry(
        "warden_server.cli.limits:limits",
        "Rate limits, budgets and concurrency caps of the policies in force.",
    ),
}
"""Each command's name, where it is defined, and its line in ``warden --help``."""


class _Commands(click.Group):
    """The commands of ``COMMANDS``, each imported when first asked for:
    ``warden --help`` lists them without importing any."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, _, attribute = COMMANDS[cmd_name].target.partition(":")
            command: click.Command = getattr(importlib.import_module(module), attribute)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name].summary) for name in sorted(COMMANDS)])


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="warden")
def main() -> None:
    """Warden: a policy-as-code governance plane for the operations AI models may call."""


__all__ = ["main"]
