"""``warden policy``: check, test, inspect and describe policy folders."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import click
import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from warden.shared.schema import InvalidSchemaError
from warden.shared.tls import sync_channel
from warden.v1 import policy_pb2, policy_pb2_grpc
from warden_server.auth.actors import AuthenticationError, actor_from_claims
from warden_server.cli.common import (
    TARGET_OPTION,
    checked_target,
    open_store_file,
    required_token,
    rpc_refused,
)
from warden_server.cli.common import tls_credentials as _tls_credentials
from warden_server.errors import InvalidRequest
from warden_server.policy import typecheck
from warden_server.policy.engine import PolicySet
from warden_server.policy.explain import Explanation, explain
from warden_server.policy.inputs import InputSchema, schemas_from_snapshot
from warden_server.policy.loader import PolicyLoadError, Problem, load_policies
from warden_server.policy.model import json_schema, parse_timestamp
from warden_server.policy.serving import evaluator_for
from warden_server.policy.testing import (
    Registered,
    TestReport,
    load_test_cases,
    registered_capabilities,
    run_policy_tests,
)
from warden_server.registry import CapabilityDefinition, Registry
from warden_server.services import convert

R = TypeVar("R")
RPC_TIMEOUT = 10.0
SNAPSHOT = "capabilities.json"
"""The schema snapshot kept beside the policies, read by `check` when present."""

DIRECTORY = click.argument(
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default="policies",
    metavar="[DIRECTORY (default: policies)]",
)
TARGET = click.option(
    "--target", metavar="HOST:PORT", callback=checked_target, help="A running plane."
)
TOKEN = click.option(
    "--token",
    envvar="WARDEN_TOKEN",
    help="An actor JWT with the role policy-author, auditor or auditor:all (or set WARDEN_TOKEN).",
)


@click.group()
def policy() -> None:
    """Check, test and inspect policy files."""


SNAPSHOT_OPTION = click.option(
    "--capabilities",
    "snapshot",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A capabilities snapshot (JSON, from `warden policy capabilities --out`) "
    f"to check inputs against; DIRECTORY/{SNAPSHOT} is used when present.",
)
STORE_OPTION = click.option(
    "--store",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Check inputs against the capabilities registered in this SQLite store.",
)


@policy.command("check")
@DIRECTORY
@SNAPSHOT_OPTION
@STORE_OPTION
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
    snapshot = _snapshot_beside(directory, snapshot, store, target)
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
        f"ok: {_plural(len(policies.rules), 'rule')}"
        + (f", {_plural(len(policies.limits), 'limit')}" if policies.limits else "")
        + f" in {_plural(len(policies.files), 'file')}, "
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
@SNAPSHOT_OPTION
@STORE_OPTION
@TARGET
@TOKEN
@click.option("--run", "pattern", help="Run only the tests whose name matches this regex.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per case, then a summary.")
@click.option(
    "--min-coverage",
    type=click.FloatRange(0, 100),
    default=0.0,
    show_default=True,
    help="Fail below this percentage of rules exercised and condition outcomes seen, together.",
)
def policy_test(
    directory: Path,
    snapshot: Path | None,
    store: Path | None,
    target: str | None,
    token: str | None,
    pattern: str | None,
    as_json: bool,
    min_coverage: float,
) -> None:
    """Run the test cases in DIRECTORY/tests against the policies in DIRECTORY.

    A case calls its capability as registered, read from the same sources as
    for `check` (--target, --store, --capabilities, DIRECTORY/capabilities.json):
    named by id, with its version, service, side effect and tags; its input
    checked against the input schema (an input the plane refuses fails the
    case) and typed as the plane types it.

    Prints a PASS/FAIL line per case, the rules no case made match, the
    condition outcomes no case produced (each && and || operand, and each
    condition, seen true and seen false), and a summary; exits 1 on any
    failure, problem, or coverage below --min-coverage.
    """
    try:
        selector = re.compile(pattern) if pattern else None
    except re.error as exc:
        raise click.BadParameter(f"not a regular expression: {exc}", param_hint="--run") from None
    snapshot = _snapshot_beside(directory, snapshot, store, target)
    records, origin = _capability_records(snapshot, store, target, token)
    registered = _newest(records, origin) if records is not None else None
    try:
        # Compiled for the fast evaluator, whose reference twin runs every case too.
        policies = load_policies(directory, evaluator=evaluator_for("cel-cpp"))
    except PolicyLoadError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(1) from None
    report = run_policy_tests(policies, directory, pattern=selector, capabilities=registered)
    for problem in sorted(report.problems):
        click.echo(str(problem), err=True)
    coverage = report.coverage * 100
    # Rounded down: 99.6% never shows as the 100% it is not.
    percent = f"{math.floor(coverage)}%"
    if as_json:
        for case in report.cases:
            click.echo(json.dumps(case.to_json()))
        click.echo(json.dumps({"summary": report.summary_json()}))
    else:
        _print_test_report(report, percent)
    if report.unregistered:
        where = (
            f"not in the {origin}"
            if records is not None
            else f"not known (give --target and --token, --store, or keep DIRECTORY/{SNAPSHOT})"
        )
        click.echo(
            f"capabilities {where}: {', '.join(report.unregistered)}; the cases naming them "
            'call them as version "1", service "", side effect "write", without tags',
            err=True,
        )
    if not report.cases:
        click.echo("no test cases found" + (f" matching {pattern!r}" if pattern else ""), err=True)
    if coverage < min_coverage:
        click.echo(f"coverage {percent} is below {min_coverage:g}%", err=True)
    if not report.ok or coverage < min_coverage:
        raise SystemExit(1)


def _newest(records: list[dict[str, Any]], origin: str) -> dict[str, Registered]:
    """The newest version of each capability in ``records``, as a policy test
    or an explanation calls it."""
    try:
        return registered_capabilities(records)
    except ValueError as exc:
        raise click.ClickException(f"{origin}: {exc}") from None


def _print_test_report(report: TestReport, percent: str) -> None:
    """A PASS/FAIL line per case (with why, for a failure), what no case
    exercised, and the summary line."""
    for case in report.cases:
        line = f"{'PASS' if case.passed else 'FAIL'}  {case.name}"
        if not case.passed:
            shown = {k: case.actual.get(k) for k in case.expected}
            if "limit" in case.actual:  # a refusal the case did not expect
                shown["limit"] = case.actual["limit"]
            line += f"\n      {case.file}\n      expected {case.expected}\n      got      {shown}"
            line += f"\n      matched  {', '.join(case.matched) or 'no rule'}"
            for rule, error in case.errors:
                line += f"\n      rule {rule!r} failed to evaluate: {error}"
            for issue in case.input_issues:
                line += f"\n      the plane refuses the input (INPUT_INVALID): {issue}"
            if case.disagreement is not None:
                d = case.disagreement
                line += (
                    f"\n      the evaluators disagree:\n      {d.reference_name:<10} {d.reference}"
                    f"\n      {d.fast_name:<10} {d.fast}"
                )
        click.echo(line)
    if report.unexercised:
        click.echo("rules no test exercised: " + ", ".join(report.unexercised))
    if report.uncounted:
        click.echo("limits no test exercised: " + ", ".join(report.uncounted))
    unseen = report.conditions.unseen()
    if unseen:
        click.echo("condition outcomes no test produced:")
        for outcome in unseen:
            click.echo(f"  {outcome}")
    summary = report.summary_json()
    click.echo(
        f"{summary['passed']} passed, {summary['failed']} failed; coverage "
        f"{percent} (rules {summary['exercised']}/{summary['rules']}, "
        + (
            f"limits {summary['limits_exercised']}/{summary['limits']}, "
            if summary["limits"]
            else ""
        )
        + f"condition outcomes {summary['outcomes_seen']}/{summary['outcomes']})"
    )


def _json_option(value: str | None, option: str, *, mapping: bool) -> Any:
    if value is None:
        return {}
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=option) from None
    if mapping and not isinstance(data, dict):
        raise click.BadParameter("must be a JSON object", param_hint=option)
    return data


@policy.command("explain")
@DIRECTORY
@click.option("--capability", "capability_id", required=True, help="The capability id called.")
@click.option("--input", "input_json", default="{}", show_default=True, help="The input, as JSON.")
@click.option(
    "--actor-claims",
    "claims_json",
    required=True,
    help='The actor\'s verified JWT claims, as JSON: {"sub": "bot-7", "roles": ["support"]}.',
)
@click.option("--context", "context_json", help="The caller's context, as JSON.")
@click.option("--now", help="The time of the decision (RFC 3339); the present when absent.")
@click.option(
    "--default-effect",
    type=click.Choice(["deny", "allow"]),
    default="deny",
    show_default=True,
    help="The decision when no rule matches ([server] default_effect).",
)
@SNAPSHOT_OPTION
@STORE_OPTION
@TARGET
@TOKEN
@click.option("--json", "as_json", is_flag=True, help="The explanation as one JSON object.")
def policy_explain(
    directory: Path,
    capability_id: str,
    input_json: str,
    claims_json: str,
    context_json: str | None,
    now: str | None,
    default_effect: Literal["allow", "deny"],
    snapshot: Path | None,
    store: Path | None,
    target: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Show how the policies in DIRECTORY decide one request, offline: every
    rule considered, its condition's value or error, and the decision with
    the precedence that chose it (hide > deny > require_approval > allow; no
    match means the default effect).

    The capability and its input schema come from the same sources as for
    `check` (--target, --store, --capabilities, DIRECTORY/capabilities.json);
    with one, the input is validated as the plane would before policy.
    """
    value = _json_option(input_json, "--input", mapping=False)
    claims = _json_option(claims_json, "--actor-claims", mapping=True)
    context = _json_option(context_json, "--context", mapping=True)
    try:
        actor = actor_from_claims(claims).to_cel()
    except AuthenticationError as exc:
        raise click.BadParameter(str(exc), param_hint="--actor-claims") from None
    try:
        moment = parse_timestamp(now) if now else datetime.now(UTC)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--now") from None
    snapshot = _snapshot_beside(directory, snapshot, store, target)
    records, origin = _capability_records(snapshot, store, target, token)
    schemas = schemas_from_snapshot(records) if records is not None else None
    try:
        policies = load_policies(
            directory,
            default_effect=default_effect,
            evaluator=evaluator_for("cel-cpp"),
            capabilities=schemas or (),
        )
    except PolicyLoadError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(1) from None
    capability: dict[str, Any] = {"id": capability_id, "version": "", "service": ""}
    capability.update(side_effect="write", tags=[])
    issues: list[dict[str, str]] = []
    if records is not None:
        registered = _newest(records, origin).get(capability_id)
        if registered is None:
            raise click.ClickException(f"{capability_id}: no such capability in the {origin}")
        capability = registered.capability.model_dump()
        try:
            issues = registered.issues(value)
        except InvalidSchemaError as exc:
            raise click.ClickException(f"{capability_id}: input schema: {exc}") from None
        if not issues:
            value = registered.served_input(value)
    explanation = explain(
        policies,
        capability=capability,
        actor=actor,
        input=value,
        context=context,
        now=moment,
        input_issues=issues,
    )
    if as_json:
        click.echo(json.dumps(explanation.to_json()))
    else:
        _print_explanation(explanation, actor)
    if records is None:
        click.echo(
            "not checked: the input against the capability's schema, for want of one "
            f"(give --target and --token, --store, or keep DIRECTORY/{SNAPSHOT})",
            err=True,
        )


def _print_explanation(explanation: Explanation, actor: dict[str, Any]) -> None:
    capability = explanation.capability
    version = f" v{capability['version']}" if capability.get("version") else ""
    click.echo(
        f"{capability['id']}{version} called by {actor['id']} "
        f"(roles: {', '.join(actor['roles']) or 'none'}; tenant: {actor['tenant'] or 'none'})"
    )
    width = max((len(r.id) for r in explanation.rules), default=0)
    for stage, title in (("visibility", "hide rules"), ("policy", "policy rules")):
        lines = [r for r in explanation.rules if r.stage == stage]
        reached = stage == "visibility" or explanation.effect not in ("hide", "invalid")
        click.echo(f"{title}:" if lines else f"{title}: {'none' if reached else 'not reached'}")
        for r in lines:
            outcome = "error" if r.error else str(r.value).lower()
            audit = "  (audit mode: recorded, not enforced)" if r.mode == "audit" else ""
            click.echo(f"  {r.id:<{width}}  {r.effect:<16}  {outcome:<5}  {r.where}{audit}")
            click.echo(f"  {'':<{width}}  when: {r.when}")
            if r.error:
                click.echo(f"  {'':<{width}}  error: {r.error}")
    for issue in explanation.input_issues:
        click.echo(f"input: {issue['path'] or '(the input)'}: {issue['message']}")
    by = f", by {explanation.rule}" if explanation.rule else ""
    click.echo(f"decision: {explanation.effect}{by}")
    click.echo(f"  why: {explanation.reason}")
    if explanation.message:
        click.echo(f"  message: {explanation.message}")
    if explanation.would_have:
        shadow = explanation.would_have
        by = f", by {shadow['rule']}" if shadow.get("rule") else ""
        click.echo(f"  with the audit-mode rules enforced: {shadow['effect']}{by}")


@policy.command("status")
@TARGET_OPTION
@TOKEN
@click.option("--rules", "with_rules", is_flag=True, help="List the rules in force too.")
@click.option("--json", "as_json", is_flag=True, help="The status as one JSON object.")
def policy_status(target: str, token: str | None, with_rules: bool, as_json: bool) -> None:
    """Show the policy set a running plane enforces, the last refused change,
    and what every live replica on its store serves; exit 1 while a refused
    change is pending on any replica."""
    required_token(None, None, token)
    status = _remote(
        target,
        lambda stub: stub.GetStatus(
            policy_pb2.PolicyStatusRequest(actor_token=token or "", include_rules=with_rules),
            timeout=RPC_TIMEOUT,
        ),
    )
    data = _status_json(status, with_rules=with_rules)
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
        if with_rules:
            _print_rules(data["rules_in_force"])
        rejected = data.get("rejected")
        if rejected:
            click.echo(
                f"refused: revision {rejected['revision'][:12] or '(unreadable)'} at "
                f"{rejected['at']}, {_plural(len(data['problems']), 'problem')}:"
            )
            for p in data["problems"]:
                where = f"{p['path']}: " if p["path"] else ""
                click.echo(f"  {p['file']}:{p['line']}:{p['column']}: {where}{p['message']}")
        _echo_replicas(data["replicas"], current["revision"])
    if status.HasField("rejected") or any(r.HasField("rejected") for r in status.replicas):
        raise SystemExit(1)


def _echo_replicas(replicas: list[dict[str, Any]], revision: str) -> None:
    """One line per live replica; those serving another revision or refusing
    a change say so."""
    lagging = sum(r["revision"] != revision for r in replicas)
    refusing = sum(r["rejected"] is not None for r in replicas)
    summary = [_plural(len(replicas), "replica") + " live"]
    if lagging:
        summary.append(f"{lagging} serving another revision")
    if refusing:
        summary.append(f"{refusing} refusing a change")
    click.echo("replicas: " + ", ".join(summary))
    for r in replicas:
        notes = [
            f"revision {r['revision'][:12]}"
            + (" (another revision)" if r["revision"] != revision else ""),
            f"loaded {r['loaded_at']}",
            _plural(r["registrations"], "registration") + " seen",
        ]
        if r["rejected"] is not None:
            refused = r["rejected"]["revision"][:12] or "(unreadable)"
            notes.append(f"REFUSED {refused} at {r['rejected']['at']}")
        if r["leader"]:
            notes.append("leader")
        if r["answering"]:
            notes.append("answering")
        click.echo(f"  {r['id']}: " + ", ".join(notes))


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
    """Print a capabilities snapshot (JSON): every version of every
    registered capability. Kept as policies/capabilities.json, it lets
    `warden policy check` type-check inputs offline (in CI, say)."""
    if (store is None) == (target is None):
        raise click.UsageError("give exactly one of --store or --target")
    snapshot, _ = _capability_records(None, store, target, token)
    assert snapshot is not None
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


def _snapshot_beside(
    directory: Path, snapshot: Path | None, store: Path | None, target: str | None
) -> Path | None:
    """The snapshot to read: the one given, or DIRECTORY/capabilities.json
    when no source at all was given and it exists."""
    if snapshot is None and store is None and target is None:
        beside = directory / SNAPSHOT
        return beside if beside.is_file() else None
    return snapshot


def _capabilities(
    snapshot: Path | None, store: Path | None, target: str | None, token: str | None
) -> tuple[list[InputSchema] | None, str]:
    """The input schemas to check against, from whichever source was given,
    and where they came from."""
    records, origin = _capability_records(snapshot, store, target, token)
    return (schemas_from_snapshot(records) if records is not None else None), origin


def _capability_records(
    snapshot: Path | None, store: Path | None, target: str | None, token: str | None
) -> tuple[list[dict[str, Any]] | None, str]:
    """The capabilities (as snapshot entries) from whichever source was
    given, and where they came from; None when no source was given."""
    given = [x for x in (snapshot, store, target) if x is not None]
    if len(given) > 1:
        raise click.UsageError("give at most one of --capabilities, --store or --target")
    if snapshot is not None:
        try:
            data = json.loads(snapshot.read_text(encoding="utf-8"))
            schemas_from_snapshot(data)  # the shape, with the place of any mistake
        except (ValueError, OSError) as exc:
            raise click.ClickException(f"{snapshot}: {exc}") from None
        records = data["capabilities"] if isinstance(data, dict) else data
        return records, f"snapshot {snapshot}"
    if store is None and target is None:
        return None, ""
    origin = f"store {store}" if store is not None else f"plane {target}"
    return [
        {**definition.to_json(), "service": service}
        for definition, service in _registered(store, target, token)
    ], origin


def _registered(
    store: Path | None, target: str | None, token: str | None
) -> list[tuple[CapabilityDefinition, str]]:
    """Every registered version of every capability, with its service, read
    from a store file or asked of a running plane."""
    if store is not None:
        opened = open_store_file(store)
        try:
            return [(c.definition, c.service) for c in Registry(opened).every_version()]
        finally:
            opened.close()
    assert target is not None
    required_token(None, None, token)  # the plane asks every caller for one
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


def _print_rules(rules: list[dict[str, Any]]) -> None:
    click.echo("rules in force:" if rules else "rules in force: none")
    width = max((len(r["id"]) for r in rules), default=0)
    for r in rules:
        audit = "  (audit mode: recorded, not enforced)" if r["mode"] == "audit" else ""
        click.echo(
            f"  {r['id']:<{width}}  {r['effect']:<16}  {', '.join(r['capabilities'])}  "
            f"{r['file']}:{r['line']}{audit}"
        )
        indent = f"  {'':<{width}}  "
        click.echo(f"{indent}when: {r['when']}")
        if r["approvers"]:
            ttl = f" (open for {r['ttl']})" if r["ttl"] else ""
            click.echo(f"{indent}approvers: {r['approvers']}{ttl}")


def _status_json(status: policy_pb2.PolicyStatus, *, with_rules: bool) -> dict[str, Any]:
    def when(stamp: Timestamp) -> str:
        return stamp.ToDatetime().isoformat(timespec="seconds") + "Z"

    def revision(message: policy_pb2.PolicyRevision) -> dict[str, Any]:
        return {
            "revision": message.revision,
            "files": list(message.files),
            "at": when(message.at),
        }

    data: dict[str, Any] = {
        "current": revision(status.current),
        "rules": status.rules,
        "directory": status.directory,
        "watching": status.watching,
        "replicas": [
            {
                "id": r.id,
                "host": r.host,
                "processes": r.processes,
                "revision": r.current.revision,
                "loaded_at": when(r.current.at),
                "rejected": (
                    {"revision": r.rejected.revision, "at": when(r.rejected.at)}
                    if r.HasField("rejected")
                    else None
                ),
                "registrations": r.registrations,
                "leader": r.leader,
                "seen_at": when(r.seen_at),
                "answering": r.answering,
            }
            for r in status.replicas
        ],
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
    if with_rules:
        data["rules_in_force"] = [
            {
                "id": r.id,
                "file": r.file,
                "line": r.line,
                "effect": r.effect,
                "mode": r.mode,
                "capabilities": list(r.capabilities),
                "when": r.when,
                "message": r.message or None,
                "message_expr": r.message_expr or None,
                "approvers": r.approvers or None,
                "ttl": r.ttl or None,
                "description": r.description or None,
            }
            for r in status.rules_in_force
        ]
    return data


def _plural(count: int, noun: str) -> str:
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"
