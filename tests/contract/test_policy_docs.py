"""docs/policies.md stays true to the code: every `warden policy` command, every
variable and field, and the cost limits it states."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from warden_server.cli import main
from warden_server.cli.policy import policy
from warden_server.policy import loader, variables

GUIDE = (Path(__file__).resolve().parent.parent.parent / "docs" / "policies.md").read_text()


def test_every_policy_command_is_documented_and_has_help() -> None:
    for name, command in policy.commands.items():
        assert f"warden policy {name}" in GUIDE, name
        assert command.help, name
        # Through the warden command, as a user runs it: click keeps a
        # command's help option from its first context, and a group run on
        # its own has no -h (warden's does), which a later test would meet.
        result = CliRunner().invoke(main, ["policy", name, "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output


def test_every_variable_and_field_is_documented() -> None:
    for name in sorted(variables.WHEN | variables.APPROVERS):
        assert f"`{name}`" in GUIDE, name
    for name, fields in variables.FIELDS.items():
        for field in fields:
            assert f"`{field}`" in GUIDE, f"{name}.{field}"


def test_the_cost_limits_are_the_ones_enforced() -> None:
    assert f"at most {loader.MAX_EXPRESSION_CHARS:,} characters" in GUIDE
    assert f"{loader.MAX_EXPRESSION_NODES:,} syntax nodes" in GUIDE
    assert f"syntax depth of {loader.MAX_EXPRESSION_DEPTH}" in GUIDE
    assert f"nested at most {loader.MAX_COMPREHENSION_NESTING} deep" in GUIDE
