"""``warden policy``: check and test policy folders."""

from __future__ import annotations

import json

import click

from warden_server.policy.loader import PolicyLoadError, load_policies
from warden_server.policy.testing import run_policy_tests


@click.group()
def policy() -> None:
    """Check and test policy files."""


@policy.command("check")
@click.argument("directory", type=click.Path(file_okay=False), default="policies")
def policy_check(directory: str) -> None:
    """Report every problem in a policy folder, each as file:line:col."""
    try:
        policies = load_policies(directory)
    except PolicyLoadError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(1) from None
    click.echo(
        f"ok: {len(policies.rules)} rules in {len(policies.files)} files "
        f"(revision {policies.revision[:12]})"
    )


@policy.command("test")
@click.argument("directory", type=click.Path(file_okay=False), default="policies")
@click.option("--run", "pattern", help="Run only the tests whose name matches this regex.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option(
    "--min-coverage",
    type=click.FloatRange(0, 100),
    default=0.0,
    help="Fail below this percentage of rules exercised.",
)
def policy_test(directory: str, pattern: str | None, as_json: bool, min_coverage: float) -> None:
    """Run the test cases in DIRECTORY/tests against the policies in DIRECTORY."""
    try:
        policies = load_policies(directory)
    except PolicyLoadError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(1) from None
    report = run_policy_tests(policies, directory, pattern=pattern)
    for problem in report.problems:
        click.echo(str(problem), err=True)
    for case in report.cases:
        if as_json:
            click.echo(json.dumps(case.to_json()))
        else:
            mark = "PASS" if case.passed else "FAIL"
            line = f"{mark}  {case.name}"
            if not case.passed:
                line += f"\n      expected {case.expected}\n      got      {case.actual}"
            click.echo(line)
    coverage = report.coverage * 100
    summary = (
        f"{len(report.cases) - len(report.failed)} passed, {len(report.failed)} failed; "
        f"rule coverage {coverage:.0f}% ({len(report.exercised & set(report.rules))}"
        f"/{len(report.rules)})"
    )
    if as_json:
        click.echo(json.dumps({"summary": summary, "unexercised": report.unexercised}))
    else:
        if report.unexercised:
            click.echo("rules no test exercised: " + ", ".join(report.unexercised))
        click.echo(summary)
    if not report.cases:
        click.echo("no test cases found", err=True)
    if not report.ok or coverage < min_coverage:
        raise SystemExit(1)
