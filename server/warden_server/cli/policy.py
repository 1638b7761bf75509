"""``warden policy``: check, test, inspect and describe policy folders."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import grpc

from warden.shared.tls import sync_channel
from warden.v1 import policy_pb2, policy_pb2_grpc
from warden_server.cli.common import TARGET_OPTION, open_store_file, rpc_refused
from warden_server.cli.common import tls_credentials as _tls_credentials
from warden_server.errors import InvalidRequest
from warden_server.policy import typecheck
from warden_server.policy.engine import PolicySet
from warden_server.policy.inputs import InputSchema, schemas_from_snapshot
from warden_server.policy.loader import PolicyLoadError, Problem, load_policies
from warden_server.policy.model import json_schema
from warden_server.policy.serving import evaluator_for
from warden_server.policy.testing import load_test_cases, run_policy_tests
from warden_server.registry import CapabilityDefinition, Registry
from warden_server.services import convert

R = TypeVar("R")
RPC_TIMEOUT = 10.0
SNAPSHOT = "capabilities.json"
"""The schema snapshot kept beside the policies, read by `check` when present."""

DIRECTORY = click.argument(
    "directory", type=click.Path(file_okay=False, path_type=Path), default="policies"
)
TARGET = click.option("--target", metavar="HOST:PORT", help="A running plane.")
TOKEN = click.option(
    "--token",
    envvar="WARDEN_TOKEN",
    help="An actor JWT with the role policy-author, auditor or auditor:all (or set WARDEN_TOKEN).",
)


@click.group()
def policy() -> None:
    """Check, test and inspect policy files."""


@policy.command("check")
@DIRECTORY
@click.option(
    "--capabilities",
    "snapshot",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A capabilities snapshot (JSON, from `warden policy capabilities --out`) "
    f"to check inputs against; DIRECTORY/{SNAPSHOT} is used when present.",
)
@click.option(
    "--store",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Check inputs against the capabilities registered in this SQLite store.",
)
@TARGET
@TOKEN
@click.option("--json", "as_json", is_flag=True, help="One JSON object per problem.")
def policy_check(
    directory: Path,
    snapshot: Path | None,
    store: Path | None,
    target: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Report every problem in a policy folder and its tests, each as
    file:line:col and the path inside the document; exit 1 if there is any.

    Every expression is type-checked. The input of a rule is typed from the
    input schemas of the capabilities its globs match, read from --target
    (a running plane), --store, --capabilities, or DIRECTORY/capabilities.json,
    in that order; without any of them, input is not checked, and the
    output says so.
    """
    if snapshot is None and store is None and target is None:
        beside = directory / SNAPSHOT
        snapshot = beside if beside.is_file() else None
    capabilities, origin = _capabilities(snapshot, store, target, token)
    problems: list[Problem] = []
    policies: PolicySet | None = None
    try:
        policies = load_policies(directory, capabilities=capabilities or ())
    except PolicyLoadError as exc:
        problems.extend(exc.problems)
    cases, test_problems = load_test_cases(directory, policies)
    problems = sorted(problems + test_problems)
    for problem in problems:
        click.echo(json.dumps(problem.to_json()) if as_json else str(problem))
    if problems:
        files = len({p.file for p in problems})
        if not as_json:
            click.echo(f"{_plural(len(problems), 'problem')} in {_plural(files, 'file')}", err=True)
        raise SystemExit(1)
    assert policies is not None
    checked = (
        f"; input fields and types checked against "
        f"{_plural(len(capabilities), 'capability')} ({origin})"
        if capabilities is not None
        else ""
    )
    click.echo(
        f"ok: {_plural(len(policies.rules), 'rule')} in {_plural(len(policies.files), 'file')}, "
        f"{_plural(len(cases), 'test case')} (revision {policies.revision[:12]}){checked}",
        err=as_json,
    )
    for limit in _unchecked(capabilities):
        click.echo(f"not checked: {limit}", err=True)


def _unchecked(capabilities: list[InputSchema] | None) -> list[str]:
    """What the check could not do, in words."""
    limits = []
    problem = typecheck.available()
    if problem is not None:
        limits.append(f"types of expressions ({problem})")
    if capabilities is None:
        limits.append(
            "fields and types of input, for want of capability schemas: give --target "
            f"and --token, --store, or keep DIRECTORY/{SNAPSHOT} (written by "
            "`warden policy capabilities --out`)"
        )
    return limits


@policy.command("test")
@DIRECTORY
@click.option("--run", "pattern", help="Run only the tests whose name matches this regex.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per case, then a summary.")
@click.option(
    "--min-coverage",
    type=click.FloatRange(0, 100),
    default=0.0,
    show_default=True,
    help="Fail below this percentage of rules exercised and condition outcomes seen, together.",
)
def policy_test(directory: Path, pattern: str | None, as_json: bool, min_coverage: float) -> None:
    """Run the test cases in DIRECTORY/tests against the policies in DIRECTORY.

    Prints a PASS/FAIL line per case, the rules no case made match, the
    condition outcomes no case produced (each && and || operand, and each
    condition, seen true and seen false), and a summary; exits 1 on any
    failure, problem, or coverage below --min-coverage.
    """
    try:
        selector = re.compile(pattern) if pattern else None
    except re.error as exc:
        raise click.BadParameter(f"not a regular expression: {exc}", param_hint="--run") from None
    try:
        # Compiled for the fast evaluator, whose reference twin runs every case too.
        policies = load_policies(directory, evaluator=evaluator_for("cel-cpp"))
    except PolicyLoadError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(1) from None
    report = run_policy_tests(policies, directory, pattern=selector)
    for problem in sorted(report.problems):
        click.echo(str(problem), err=True)
    for case in report.cases:
        if as_json:
            click.echo(json.dumps(case.to_json()))
            continue
        line = f"{'PASS' if case.passed else 'FAIL'}  {case.name}"
        if not case.passed:
            shown = {k: case.actual.get(k) for k in case.expected}
            line += f"\n      {case.file}\n      expected {case.expected}\n      got      {shown}"
            line += f"\n      matched  {', '.join(case.matched) or 'no rule'}"
            for rule, error in case.errors:
                line += f"\n      rule {rule!r} failed to evaluate: {error}"
            if case.disagreement is not None:
                d = case.disagreement
                line += (
                    f"\n      the evaluators disagree:\n      {d.reference_name:<10} {d.reference}"
                    f"\n      {d.fast_name:<10} {d.fast}"
                )
        click.echo(line)
    coverage = report.coverage * 100
    # Rounded down: 99.6% never shows as the 100% it is not.
    percent = f"{math.floor(coverage)}%"
    if as_json:
        click.echo(json.dumps({"summary": report.summary_json()}))
    else:
        if report.unexercised:
            click.echo("rules no test exercised: " + ", ".join(report.unexercised))
        unseen = report.conditions.unseen()
        if unseen:
            click.echo("condition outcomes no test produced:")
            for outcome in unseen:
                click.echo(f"  {outcome}")
        summary = report.summary_json()
        click.echo(
            f"{summary['passed']} passed, {summary['failed']} failed; coverage "
            f"{percent} (rules {summary['exercised']}/{summary['rules']}, "
            f"condition outcomes {summary['outcomes_seen']}/{summary['outcomes']})"
        )
    if not report.cases:
        click.echo("no test cases found" + (f" matching {pattern!r}" if pattern else ""), err=True)
    if coverage < min_coverage:
        click.echo(f"coverage {percent} is below {min_coverage:g}%", err=True)
    if not report.ok or coverage < min_coverage:
        raise SystemExit(1)


@policy.command("status")
@TARGET_OPTION
@TOKEN
@click.option("--json", "as_json", is_flag=True, help="The status as one JSON object.")
def policy_status(target: str, token: str | None, as_json: bool) -> None:
    """Show the policy set a running plane enforces and the last refused
    change; exit 1 while a refused change is pending."""
    status = _remote(
        target,
        lambda stub: stub.GetStatus(
            policy_pb2.PolicyStatusRequest(actor_token=token or ""), timeout=RPC_TIMEOUT
        ),
    )
    data = _status_json(status)
    if as_json:
        click.echo(json.dumps(data))
    else:
        current = data["current"]
        click.echo(
            f"in force: revision {current['revision'][:12]}, {_plural(data['rules'], 'rule')} "
            f"in {', '.join(current['files']) or 'no files'} (loaded {current['at']})"
        )
        click.echo(
            f"folder: {data['directory']} ({'watched' if data['watching'] else 'not watched'})"
        )
        rejected = data.get("rejected")
        if rejected:
            click.echo(
                f"refused: revision {rejected['revision'][:12] or '(unreadable)'} at "
                f"{rejected['at']}, {_plural(len(data['problems']), 'problem')}:"
            )
            for p in data["problems"]:
                where = f"{p['path']}: " if p["path"] else ""
                click.echo(f"  {p['file']}:{p['line']}:{p['column']}: {where}{p['message']}")
    if status.HasField("rejected"):
        raise SystemExit(1)


@policy.command("capabilities")
@click.option(
    "--store",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read the capabilities registered in this SQLite store.",
)
@TARGET
@TOKEN
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"Write the snapshot to this file (e.g. policies/{SNAPSHOT}) instead of printing it.",
)
def policy_capabilities(
    store: Path | None, target: str | None, token: str | None, out: Path | None
) -> None:
    """Print a capabilities snapshot (JSON): the latest version of every
    registered capability. Kept as policies/capabilities.json, it lets
    `warden policy check` type-check inputs offline (in CI, say)."""
    if (store is None) == (target is None):
        raise click.UsageError("give exactly one of --store or --target")
    snapshot = [
        {**definition.to_json(), "service": service}
        for definition, service in _registered(store, target, token)
    ]
    text = json.dumps({"capabilities": snapshot}, indent=2, sort_keys=True)
    if out is None:
        click.echo(text)
        return
    try:
        out.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"{out}: {exc.strerror}") from None
    click.echo(f"wrote {_plural(len(snapshot), 'capability')} to {out}", err=True)


@policy.command("schema")
@click.option("--tests", "for_tests", is_flag=True, help="The schema of test files instead.")
def policy_schema(for_tests: bool) -> None:
    """Print the JSON Schema of policy files (or test files), for editors:
    `# yaml-language-server: $schema=PATH` at the top of a file uses it."""
    click.echo(json.dumps(json_schema(tests=for_tests), indent=2))


def _capabilities(
    snapshot: Path | None, store: Path | None, target: str | None, token: str | None
) -> tuple[list[InputSchema] | None, str]:
    """The input schemas to check against, from whichever source was given,
    and where they came from."""
    given = [x for x in (snapshot, store, target) if x is not None]
    if len(given) > 1:
        raise click.UsageError("give at most one of --capabilities, --store or --target")
    if snapshot is not None:
        try:
            schemas = schemas_from_snapshot(json.loads(snapshot.read_text(encoding="utf-8")))
        except (ValueError, OSError) as exc:
            raise click.ClickException(f"{snapshot}: {exc}") from None
        return schemas, f"snapshot {snapshot}"
    if store is None and target is None:
        return None, ""
    origin = f"store {store}" if store is not None else f"plane {target}"
    return [
        InputSchema(definition.id, definition.input_schema, definition.version)
        for definition, _ in _registered(store, target, token)
    ], origin


def _registered(
    store: Path | None, target: str | None, token: str | None
) -> list[tuple[CapabilityDefinition, str]]:
    """The latest version of every registered capability, with its service,
    read from a store file or asked of a running plane."""
    if store is not None:
        opened = open_store_file(store)
        try:
            return [(c.definition, c.service) for c in Registry(opened).latest()]
        finally:
            opened.close()
    assert target is not None
    response = _remote(target, lambda stub: _list_capabilities(stub, token))
    try:
        return [
            (convert.definition_from_proto(c.definition), c.service) for c in response.capabilities
        ]
    except InvalidRequest as exc:
        raise click.ClickException(f"{target}: {exc}") from None


def _list_capabilities(
    stub: policy_pb2_grpc.PoliciesStub, token: str | None
) -> policy_pb2.PolicyCapabilitiesResponse:
    request = policy_pb2.PolicyCapabilitiesRequest(actor_token=token or "")
    response: policy_pb2.PolicyCapabilitiesResponse = stub.ListCapabilities(
        request, timeout=RPC_TIMEOUT
    )
    return response


def _remote(target: str, call: Callable[[policy_pb2_grpc.PoliciesStub], R]) -> R:
    """One call to a plane's Policies service; gRPC errors become one clear message."""
    with sync_channel(target, _tls_credentials()) as channel:
        try:
            return call(policy_pb2_grpc.PoliciesStub(channel))
        except grpc.RpcError as exc:
            raise rpc_refused(target, exc) from None


def _status_json(status: policy_pb2.PolicyStatus) -> dict[str, Any]:
    def revision(message: policy_pb2.PolicyRevision) -> dict[str, Any]:
        return {
            "revision": message.revision,
            "files": list(message.files),
            "at": message.at.ToDatetime().isoformat(timespec="seconds") + "Z",
        }

    data: dict[str, Any] = {
        "current": revision(status.current),
        "rules": status.rules,
        "directory": status.directory,
        "watching": status.watching,
    }
    if status.HasField("rejected"):
        data["rejected"] = revision(status.rejected)
        data["problems"] = [
            {
                "file": p.file,
                "line": p.line,
                "column": p.column,
                "path": p.path,
                "message": p.message,
            }
            for p in status.problems
        ]
    return data


def _plural(count: int, noun: str) -> str:
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"
