"""``warden audit tail``: audit records as JSON lines, oldest first, from a
sequence number on, and with ``--follow`` as they are written: a stream for
a SIEM's collector.

It reads through the audit API like every other read (or the store file), so
an auditor's stream holds their tenant's records only, and every poll is
itself recorded as an ``access`` record. The position is the sequence number
of the last record printed: a stream stopped at any point resumes with
``--after SEQ`` without a gap or a repeat, and ``--follow`` rides out a
plane that restarts, picking up after the last record it printed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import click

from warden.shared.reach import NO_PLANE
from warden_server.audit.reader import MAX_LIMIT, AuditFilter
from warden_server.cli.audit import _filter, _source, filter_options, source_options
from warden_server.cli.audit_sources import AuditSource

PAGE = 1000
MAX_BACKOFF_S = 30.0
_PASSING = ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")


def newer_than(source: AuditSource, f: AuditFilter, after: int) -> list[dict[str, Any]]:
    """Every record matching ``f`` with a sequence number above ``after``,
    oldest first: the newest pages, walked back until ``after`` is reached."""
    found: list[dict[str, Any]] = []
    before: int | None = None
    while True:
        page = source.query(f, limit=min(PAGE, MAX_LIMIT), before=before)
        newer = [row for row in page.rows if row["seq"] > after]
        found.extend(newer)
        if len(newer) < len(page.rows) or page.next_before is None:
            break
        before = page.next_before
    return sorted(found, key=lambda row: int(row["seq"]))


def head(source: AuditSource, f: AuditFilter) -> int:
    """The newest matching record's sequence number (0 for none)."""
    rows = source.query(f, limit=1, before=None).rows
    return int(rows[0]["seq"]) if rows else 0


def tail(
    open_source: Callable[[], AuditSource],
    f: AuditFilter,
    after: int | None,
    *,
    follow: bool,
    interval_s: float,
    note: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[dict[str, Any]]:
    """The records after ``after`` (None: after the current newest), then,
    when following, each new one as it is written.

    A plane that cannot be reached, is busy or is restarting is waited for
    (with backoff up to ``MAX_BACKOFF_S``) while following; otherwise its
    refusal is raised.
    """
    position = after
    backoff = interval_s
    source: AuditSource | None = None
    told = False
    while True:
        try:
            if source is None:
                source = open_source()
            if position is None:
                position = head(source, f)
            elif not told:
                told = True
                newest = head(source, AuditFilter())
                if position > newest:  # a SEQ from another log, or mistyped
                    note(
                        f"--after {position} is past the newest record it can read "
                        f"(seq {newest}): records up to seq {position} will not be printed"
                    )
            for row in newer_than(source, f, position):
                yield row
                position = int(row["seq"])
            backoff = interval_s
        except click.ClickException as exc:
            if not follow or not _passing(exc):
                raise
            note(f"{exc.format_message()}; retrying in {backoff:.0f}s after seq {position}")
            if source is not None:
                source.close()
                source = None
            sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
            continue
        if not follow:
            source.close()
            return
        sleep(interval_s)


def _passing(exc: click.ClickException) -> bool:
    """Whether a refusal may pass: the plane away, restarting or busy."""
    message = exc.format_message()
    return message.startswith(NO_PLANE) or any(f"answered {s}" in message for s in _PASSING)


@click.command("tail")
@source_options
@filter_options
@click.option(
    "--after",
    type=click.IntRange(0, 2**63 - 1),
    metavar="SEQ",
    help="Start after record SEQ (0: from the first record); by default after the newest, "
    "so only what is written from now on. Give the last seq you stored to resume.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing records as they are written.")
@click.option(
    "--interval",
    type=click.FloatRange(0.2, 3600),
    default=2.0,
    show_default=True,
    help="Seconds between polls with --follow (each poll is an audit read, and recorded).",
)
def audit_tail(after: int | None, follow: bool, interval: float, **values: Any) -> None:
    """Audit records as JSON lines, oldest first, after a sequence number;
    with --follow, as they are written."""
    f = _filter(values)

    def open_source() -> AuditSource:
        return _source(dict(values))

    def note(text: str) -> None:
        click.echo(text, err=True)

    try:
        for row in tail(open_source, f, after, follow=follow, interval_s=interval, note=note):
            click.echo(json.dumps(row, ensure_ascii=False))
    except KeyboardInterrupt:
        return
