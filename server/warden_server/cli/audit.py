"""``warden audit``: query, count, verify, export and prune the audit log.

Every read command works on the store file (``--config`` or ``--store``) or,
with ``--target`` and an auditor's ``--token``, through the plane's audit API,
which scopes answers to the auditor's tenant and records each read.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, NoReturn, TypeVar

import click

from warden.shared.codes import STAGES
from warden_server.audit.anchors import Anchor, newest_published
from warden_server.audit.anchors import check as anchors_check
from warden_server.audit.anchors import head as anchors_head
from warden_server.audit.chain import VerifyResult
from warden_server.audit.checkpoint import (
    CheckpointKeyError,
    CheckpointSigner,
    CheckpointVerifier,
)
from warden_server.audit.reader import GROUPINGS, MAX_LIMIT, AuditFilter, Stats, plain
from warden_server.audit.retention import PruneRefused, prune
from warden_server.audit.times import parse_time
from warden_server.cli.audit_sources import AuditSource, LocalSource, RemoteSource
from warden_server.cli.common import (
    CONFIG_OPTION,
    STORE_OPTION,
    check_store_file,
    checked_target,
    load,
    open_store,
)
from warden_server.config import Config
from warden_server.errors import InvalidRequest, RequestError
from warden_server.records.events import KINDS
from warden_server.store import StoreUnreadable
from warden_server.store.sqlite import damage

F = TypeVar("F", bound=Callable[..., Any])

TABLE_COLUMNS = (
    "seq",
    "ts",
    "kind",
    "status",
    "capability_id",
    "actor_id",
    "tenant",
    "stage",
    "code",
    "reason",
)


def checked_time(
    _context: click.Context | None, _param: click.Parameter | None, value: str | None
) -> str | None:
    """A time option (``--since``, ``--until``, ``--before``) that neither form
    reads is a usage error, as any other malformed option is; the value itself
    is resolved against the clock where it is used."""
    if value is not None:
        try:
            parse_time(value, datetime.now(UTC), "the value")
        except InvalidRequest as exc:
            raise click.BadParameter(str(exc)) from None
    return value


def source_options(command: F) -> F:
    """Where to read: the store (--config/--store) or the audit API (--target/--token)."""
    for option in reversed(
        (
            CONFIG_OPTION,
            STORE_OPTION,
            click.option(
                "--target",
                metavar="HOST:PORT",
                callback=checked_target,
                help="Read through the plane's audit API instead of the store file.",
            ),
            click.option(
                "--token",
                envvar="WARDEN_TOKEN",
                help="An auditor's JWT for --target (or set WARDEN_TOKEN).",
            ),
        )
    ):
        command = option(command)
    return command


def filter_options(command: F) -> F:
    """The filters every read command shares."""
    for option in reversed(
        (
            click.option(
                "--since",
                callback=checked_time,
                help="From this time, inclusive: ISO 8601 or 15m, 1h, 7d ago.",
            ),
            click.option(
                "--until",
                callback=checked_time,
                help="Up to this time, exclusive, in the same forms.",
            ),
            click.option(
                "--capability",
                "capabilities",
                multiple=True,
                help="A capability id or glob (orders.*); repeat for any of several.",
            ),
            click.option("--actor", help="Actor id."),
            click.option("--tenant", help="Tenant."),
            click.option("--stage", type=click.Choice(list(STAGES)), help="The failure's stage."),
            click.option("--code", help="Error code, e.g. POLICY_DENIED."),
            click.option(
                "--status", help="granted, failed, suspended, rejected, succeeded, allowed..."
            ),
            click.option("--kind", type=click.Choice(KINDS)),
            click.option("--invocation", help="Invocation id."),
        )
    ):
        command = option(command)
    return command


def _filter(values: dict[str, Any]) -> AuditFilter:
    return AuditFilter(
        since=values.pop("since"),
        until=values.pop("until"),
        capabilities=tuple(values.pop("capabilities")),
        actor=values.pop("actor"),
        tenant=values.pop("tenant"),
        stage=values.pop("stage"),
        code=values.pop("code"),
        status=values.pop("status"),
        kind=values.pop("kind"),
        invocation=values.pop("invocation"),
    )


def _source(values: dict[str, Any], public_key: str | None = None) -> AuditSource:
    config_path, store = values.pop("config_path"), values.pop("store")
    target, token = values.pop("target"), values.pop("token")
    if target and store:
        raise click.UsageError(
            "give --store (read the file) or --target (read through the audit API), not both"
        )
    if target:
        if not token:
            raise click.UsageError("--target needs an auditor's --token (or WARDEN_TOKEN)")
        return RemoteSource(target, token)
    config = _config_if_present(config_path, store)
    return LocalSource(open_store(config_path, store), _key_file(config, public_key))


def _key_file(config: Config | None, given: str | None) -> Path | None:
    """The checkpoint key: the one given, else the config's."""
    if given:
        return Path(given)
    configured = config.audit.checkpoint_key_file if config else None
    return config.path(configured) if config and configured else None


def _config_if_present(config_path: str, store: str | None) -> Config | None:
    """The config; None when --store names the store and no --config file
    was given: a warden.toml that happens to lie in the current folder is not
    read (it could fail to load, or lend its checkpoint key unasked)."""
    if store and not (_given("config_path") and Path(config_path).exists()):
        return None
    return load(config_path)


def _given(name: str) -> bool:
    """Whether the option was given on the command line (or its variable)."""
    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, click.core.ParameterSource.DEFAULT)


@click.group()
def audit() -> None:
    """Query, count, verify, export and prune the audit log."""


@audit.command("query")
@source_options
@filter_options
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIMIT),
    default=100,
    show_default=True,
    help="Records per page.",
)
@click.option(
    "--before",
    type=click.IntRange(1, 2**63 - 1),
    metavar="SEQ",
    help="Only records older than record SEQ: the next page, as `more: --before SEQ` says.",
)
@click.option("--json", "as_json", is_flag=True, help="JSON lines, one object per record.")
def audit_query(limit: int, before: int | None, as_json: bool, **values: Any) -> None:
    """Audit records, newest first, a page at a time."""
    source = _source(values)
    try:
        page = source.query(_filter(values), limit=limit, before=before)
    finally:
        source.close()
    if as_json:
        for row in page.rows:
            click.echo(json.dumps(row, ensure_ascii=False))
    else:
        _table(TABLE_COLUMNS, [_cells(row, TABLE_COLUMNS) for row in page.rows])
    if page.next_before is not None:
        click.echo(f"more: --before {page.next_before}", err=True)


@audit.command("stats")
@source_options
@filter_options
@click.option(
    "--by",
    "groupings",
    type=click.Choice(tuple(GROUPINGS)),
    multiple=True,
    default=("stage",),
    show_default=True,
    help="Group by this; repeat for one table per grouping.",
)
@click.option("--json", "as_json", is_flag=True, help="JSON lines, one object per group.")
def audit_stats(groupings: tuple[str, ...], as_json: bool, **values: Any) -> None:
    """Counts and rates of audit records grouped by stage, code, capability, actor
    or status."""
    source = _source(values)
    f = _filter(values)
    try:
        tables = [source.stats(by, f) for by in dict.fromkeys(groupings)]
    finally:
        source.close()
    for number, stats in enumerate(tables):
        if as_json:
            for r in stats.rows:
                line = {
                    stats.by: r.key,
                    "count": r.count,
                    "share": r.share,
                    "per_minute": r.per_minute,
                }
                click.echo(json.dumps(line, ensure_ascii=False))
            continue
        if number:
            click.echo()
        _stats_table(stats)


NOT_VERIFIED: Final = 3
"""``verify``'s exit status when it could not check the log at all."""


class _NotVerified(click.ClickException):
    """An error of ``verify`` that left the log unchecked, shown as it was."""

    exit_code = NOT_VERIFIED

    def __init__(self, error: click.ClickException) -> None:
        super().__init__(error.message)
        self.error = error

    def show(self, file: Any = None) -> None:
        self.error.show(file)


class _VerdictCommand(click.Command):
    """A command whose exit statuses 1 and 2 are verdicts (tampered, damaged):
    any error that left the log unchecked (a usage mistake, which click would
    end with 2, a plane that refused, a key that is missing) ends with
    ``NOT_VERIFIED`` instead, so a script never reads it as a verdict."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.ClickException as exc:
            raise _NotVerified(exc) from exc

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            raise _NotVerified(exc) from exc


@audit.command("verify", cls=_VerdictCommand)
@source_options
@click.option(
    "--public-key",
    type=click.Path(dir_okay=False, exists=True),
    help="The checkpoint key (PEM) when the log was pruned (default: [audit] checkpoint_key_file).",
)
@click.option(
    "--anchor",
    "anchors",
    multiple=True,
    metavar="SEQ:HASH",
    help="A head printed earlier by `warden audit head` and kept elsewhere: the record "
    "at SEQ must still have HASH (catches a log cut short or rewritten). Repeatable.",
)
@click.option(
    "--anchors",
    "anchors_file",
    type=click.Path(dir_okay=False, exists=True),
    help="An anchors file the plane published ([audit] anchor_file), kept elsewhere: its "
    "newest anchor whose signature holds under the checkpoint key is checked.",
)
def audit_verify(
    public_key: str | None, anchors: tuple[str, ...], anchors_file: str | None, **values: Any
) -> None:
    """Walk the hash chain; name the first bad sequence number.

    Exit status: 0 intact, 1 tampered (a record or an anchor), 2 the store file
    is corrupt (SQLite cannot read it), 3 not verified (the command could not
    check: a usage mistake, a refusal, a missing key).
    """
    try:
        expected = [Anchor.parse(text) for text in anchors]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--anchor") from None
    if anchors_file:
        expected.append(_published_anchor(Path(anchors_file), values, public_key))
    if not values["target"]:
        _check_file(values["config_path"], values["store"])
    try:
        result, problems = _verify(_source(values, public_key), expected)
    except click.ClickException:
        raise
    except Exception as exc:  # a damaged file can break any read; say so, never crash
        _corrupt(f"the store could not be read ({type(exc).__name__}: {exc})")
    since = f" from seq {result.start_seq} (after the retention checkpoint)"
    where = since if result.start_seq > 1 else ""
    if result.unreadable:
        _corrupt(
            f"at seq {result.first_bad_seq}: {result.problem} "
            f"({result.checked} records verified before it{where})"
        )
    if not result.ok and result.first_bad_seq is None:  # the chain holds; a row does not
        click.echo(f"TAMPERED: {plain(result.problem or '', limit=2000)}", err=True)
        sys.exit(1)
    if not result.ok:
        click.echo(
            f"TAMPERED at seq {result.first_bad_seq}: {plain(result.problem or '')} "
            f"({result.checked} records verified before it{where})",
            err=True,
        )
        sys.exit(1)
    if problems:
        for problem in problems:
            click.echo(f"TAMPERED: {problem}", err=True)
        sys.exit(1)
    # An anchor retention pruned was not checked (``_verify`` said so): it
    # holds nothing up.
    checked = [a for a in expected if a.seq >= result.start_seq]
    pruned = len(expected) - len(checked)
    held = f"; {len(checked)} anchors hold" if checked else ""
    unchecked = f" ({pruned} pruned, not checked)" if pruned else ""
    click.echo(f"ok: {result.checked} records{where}, chain intact{held}{unchecked}")
    if not checked:
        click.echo(NOT_PROVEN_WITHOUT_AN_ANCHOR, err=True)
    elif result.checked and max(a.seq for a in checked) < result.start_seq + result.checked - 1:
        click.echo(
            f"not proven: the records after seq {max(a.seq for a in checked)} (the newest "
            "anchor) could have been cut off or rewritten; a newer anchor covers them",
            err=True,
        )


NOT_PROVEN_WITHOUT_AN_ANCHOR = (
    "not proven without an anchor: that no records were cut off the end, and that the "
    "log was not replaced whole by another valid chain (give --anchor SEQ:HASH from "
    "`warden audit head`, or --anchors with the plane's published anchors)"
)


def _published_anchor(path: Path, values: dict[str, Any], public_key: str | None) -> Anchor:
    """The newest anchor of the plane's anchors file whose signature holds."""
    config = (
        None if values["target"] else _config_if_present(values["config_path"], values["store"])
    )
    key_file = _key_file(config, public_key)
    try:
        verifier = CheckpointVerifier.from_file(key_file) if key_file else None
        published = newest_published(path, verifier)
    except ValueError as exc:  # a CheckpointKeyError is one
        raise click.BadParameter(str(exc), param_hint="--anchors") from None
    if verifier is None:
        click.echo(
            "anchor signatures not checked: no checkpoint key (--public-key or "
            "[audit] checkpoint_key_file)",
            err=True,
        )
    return published.anchor


def _verify(source: AuditSource, expected: list[Anchor]) -> tuple[VerifyResult, list[str]]:
    """The chain's verdict, and what is wrong against each anchor."""
    try:
        result = source.verify()
        problems = []
        for anchor in expected if result.ok else []:
            if anchor.seq < result.start_seq:
                click.echo(f"anchor {anchor.seq}: pruned by retention, not checked", err=True)
                continue
            found = source.query(AuditFilter(seq=anchor.seq), limit=1, before=None).rows
            newest = source.query(AuditFilter(), limit=1, before=None).rows
            problem = anchors_check(
                anchor, found[0] if found else None, newest[0] if newest else None
            )
            if problem:
                problems.append(problem)
    finally:
        source.close()
    return result, problems


CORRUPTION_SHOWN = 5
"""Problems of a damaged file that ``verify`` prints before "and N more"."""


def _check_file(config_path: str, store: str | None) -> None:
    """Exit 2 when SQLite's quick check finds the store file damaged,
    which a walk of the chain alone would miss in an index."""
    if store is None and load(config_path).store_url is not None:
        return  # PostgreSQL checks its own pages (data checksums, amcheck)
    if store is not None and "://" in store:
        return
    path = Path(store) if store else load(config_path).store_path
    check_store_file(path)
    try:
        found = damage(path)
    except StoreUnreadable as exc:
        _corrupt(f"{path} cannot be read as a SQLite database ({exc})")
    if found:
        more = len(found) - CORRUPTION_SHOWN
        shown = "; ".join(found[:CORRUPTION_SHOWN]) + (f"; and {more} more" if more > 0 else "")
        _corrupt(f"{path} is damaged: {shown}")


def _corrupt(problem: str) -> NoReturn:
    click.echo(f"CORRUPT: {plain(problem, limit=1000)}", err=True)
    sys.exit(2)


@audit.command("head")
@source_options
def audit_head(**values: Any) -> None:
    """Print the chain's head as SEQ:HASH, to keep somewhere else for `verify --anchor`."""
    source = _source(values)
    try:
        page = source.query(AuditFilter(), limit=1, before=None)
    finally:
        source.close()
    anchor = anchors_head(page.rows[0] if page.rows else None)
    if anchor is None:
        raise click.ClickException("the audit log is empty: there is no head yet")
    click.echo(str(anchor))


@audit.command("export")
@source_options
@filter_options
def audit_export(**values: Any) -> None:
    """Every matching record as JSON lines, oldest first (redirect to a file)."""
    source = _source(values)
    try:
        for row in source.export(_filter(values)):
            click.echo(json.dumps(row, ensure_ascii=False))
    finally:
        source.close()


@audit.command("prune")
@CONFIG_OPTION
@STORE_OPTION
@click.option(
    "--before",
    required=True,
    callback=checked_time,
    help="Prune records older than this: ISO 8601, or a duration back from now (90d).",
)
@click.option(
    "--key",
    type=click.Path(dir_okay=False, exists=True),
    help="The Ed25519 private key (PEM) that signs the checkpoint "
    "(default: [audit] checkpoint_key_file).",
)
def audit_prune(config_path: str, store: str | None, before: str, key: str | None) -> None:
    """Delete old records, leaving a signed checkpoint so verify still holds."""
    key_path = _key_file(_config_if_present(config_path, store), key)
    if key_path is None:
        raise click.UsageError(
            "pruning signs a checkpoint: give --key or set [audit] checkpoint_key_file"
        )
    try:
        signer = CheckpointSigner.from_private_file(key_path)
    except CheckpointKeyError as exc:
        raise click.ClickException(str(exc)) from None
    opened = open_store(config_path, store)
    try:
        result = prune(opened, signer, before=before, now=datetime.now(UTC))
    except (PruneRefused, RequestError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        opened.close()
    if result.through_seq is None:
        click.echo(f"nothing older than {result.pruned_before}")
    else:
        click.echo(
            f"pruned {result.records} records through seq {result.through_seq} "
            f"(older than {result.pruned_before}); checkpoint signed by key {signer.key_id}"
        )


def _cells(row: dict[str, Any], columns: Sequence[str]) -> list[str]:
    return ["" if row[c] is None else str(row[c]) for c in columns]


def _table(header: Sequence[str], rows: list[list[str]]) -> None:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _stats_table(stats: Stats) -> None:
    minutes = stats.window_seconds / 60
    click.echo(f"{stats.total} records over {minutes:.1f} min, by {stats.by}")
    rows = [
        [
            r.key if r.key is not None else "-",
            str(r.count),
            f"{r.share * 100:.1f}%",
            f"{r.per_minute:.2f}" if r.per_minute is not None else "-",
        ]
        for r in stats.rows
    ]
    _table((stats.by, "count", "share", "per_min"), rows)


# ``audit tail`` lives in a module of its own, which builds on the options above.
from warden_server.cli.audit_tail import audit_tail  # noqa: E402

audit.add_command(audit_tail)
