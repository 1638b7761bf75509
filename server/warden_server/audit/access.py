"""Who may read the audit log, how often, and the record of every read (SI-13).

Readers are actors with the role ``auditor``; they see the records of their
own tenant unless they also hold ``auditor:all``. Reading every tenant's
records at once (verifying the whole chain) needs ``auditor:all``.

Every read by an authenticated caller, allowed or denied, is committed to the
log as an ``access`` record before it is answered, with the request's filter
(bounded: see ``bounded_request``). Each caller may read ``[audit] read_rate``
times a second on average, in bursts of ``read_burst``; past that a read is
refused ``RESOURCE_EXHAUSTED`` with the time to wait.

A refusal that needs no record of its own — a caller without a valid token,
or one over its rate — must not cost an fsync each, or anyone could fill the
store and slow every grant behind the writer. Such refusals are tallied per
kind and caller: the first in a window of ``REFUSAL_WINDOW_S`` is recorded at
once, the rest as one summary record with their count when the window ends.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from warden.shared.canonical import compact_json
from warden_server.audit.reader import AuditFilter
from warden_server.auth.actors import Actor, AuthenticationError
from warden_server.errors import PermissionDenied, RateLimited
from warden_server.records.events import AuditEvent, now_iso
from warden_server.records.query import Scope

if TYPE_CHECKING:
    from warden_server.plane import Plane
    from warden_server.store import Store

log = logging.getLogger(__name__)

AUDITOR: Final = "auditor"
AUDITOR_ALL: Final = "auditor:all"

REFUSAL_WINDOW_S: Final = 10.0
"""How long refusals of one kind and caller are gathered into one summary record."""
MAX_RECORDED_TEXT: Final = 256
"""Characters of one filter value kept in an access record."""
MAX_RECORDED_ITEMS: Final = 16
"""Items of one filter list (capability globs) kept in an access record."""
MAX_TRACKED_CALLERS: Final = 10_000
"""Rate buckets and refusal tallies kept per process; past this, idle ones go first."""

_STAGES: Final = {"UNAUTHENTICATED": "authentication", "FORBIDDEN": "authorization"}


def scope_of(actor: Actor, *, every_tenant: bool = False) -> Scope:
    """The tenants ``actor`` may read.

    Raises:
        PermissionDenied: not an auditor, an auditor without a tenant, or
            ``every_tenant`` asked of an auditor confined to one.
    """
    roles = set(actor.roles)
    if AUDITOR_ALL in roles:
        return None
    if AUDITOR not in roles:
        raise PermissionDenied(f"reading the audit log needs the role {AUDITOR}")
    if every_tenant:
        raise PermissionDenied(f"this reads every tenant's records and needs {AUDITOR_ALL}")
    if not actor.tenant:
        raise PermissionDenied(f"an {AUDITOR} without a tenant needs {AUDITOR_ALL}")
    return frozenset({actor.tenant})


def authorize_read(
    plane: Plane,
    authenticate: Callable[[], Actor],
    action: str,
    audit_filter: AuditFilter | None = None,
    *,
    every_tenant: bool = False,
    **request: Any,
) -> Scope:
    """Authenticate, rate-limit and authorize an audit read, and record it.

    Args:
        authenticate: Verifies the caller's actor JWT.
        action: What is read: ``query``, ``stats``, ``verify`` or ``export``.
        audit_filter: The read's filter; a tenant outside the caller's scope is refused.
        every_tenant: The read spans every tenant (needs ``auditor:all``).
        request: Further request fields to record (a grouping, a page size).

    Returns:
        The scope to read with.

    Raises:
        AuthenticationError: no valid actor token.
        RateLimited: the caller is over its read rate.
        PermissionDenied: see ``scope_of``, or a tenant outside the scope.
    """
    asked = {
        **(audit_filter.to_json() if audit_filter else {}),
        **{key: value for key, value in request.items() if value is not None},
    }
    reads = plane.audit_reads
    try:
        actor = authenticate()
    except AuthenticationError as exc:
        why = str(exc)
        reads.refused(
            ("rejected", None),
            lambda: _event(action, asked, None, "rejected", "UNAUTHENTICATED", why),
            action=f"audit.{action}",
        )
        raise
    wait = reads.limiter.admit(f"{actor.tenant}\x1f{actor.id}")
    if wait is not None:
        refusal = RateLimited(
            f"{actor.id} is over its rate of audit reads ([audit] read_rate)",
            retry_after_ms=math.ceil(wait * 1000),
        )
        reads.refused(
            ("limited", actor.id),
            lambda: _event(action, asked, actor, "limited", "RATE_LIMITED", str(refusal)),
            action=f"audit.{action}",
        )
        raise refusal
    try:
        scope = scope_of(actor, every_tenant=every_tenant)
        tenant = audit_filter.tenant if audit_filter else None
        if scope is not None and tenant is not None and tenant not in scope:
            raise PermissionDenied(f"{actor.id} may read tenant {actor.tenant!r} only")
    except PermissionDenied as exc:
        reads.record(_event(action, asked, actor, "denied", "FORBIDDEN", str(exc)))
        raise
    reads.record(_event(action, asked, actor, "allowed", None, None))
    return scope


def _event(
    action: str,
    asked: dict[str, Any],
    actor: Actor | None,
    status: str,
    code: str | None,
    why: str | None,
) -> AuditEvent:
    return AuditEvent(
        kind="access",
        status=status,
        actor_id=actor.id if actor else None,
        tenant=actor.tenant if actor else None,
        surface="audit-api",
        stage=_STAGES.get(code or ""),
        code=code,
        input=compact_json(bounded_request(asked)),
        reason=f"audit.{action}" + (f": {why[:MAX_RECORDED_TEXT]}" if why else ""),
    )


def bounded_request(asked: dict[str, Any]) -> dict[str, Any]:
    """The request as an access record keeps it: every text cut to
    ``MAX_RECORDED_TEXT`` characters and every list to ``MAX_RECORDED_ITEMS``
    items; when anything was cut, ``request_sha256`` is the digest of the whole
    request, so a record stays small whatever was sent and still identifies it."""
    cut = False

    def bound(value: Any) -> Any:
        nonlocal cut
        if isinstance(value, str) and len(value) > MAX_RECORDED_TEXT:
            cut = True
            return value[:MAX_RECORDED_TEXT] + f"...(+{len(value) - MAX_RECORDED_TEXT} chars)"
        if isinstance(value, list):
            if len(value) > MAX_RECORDED_ITEMS:
                cut = True
                return [bound(v) for v in value[:MAX_RECORDED_ITEMS]] + [
                    f"...(+{len(value) - MAX_RECORDED_ITEMS} more)"
                ]
            return [bound(v) for v in value]
        return value

    kept = {key: bound(value) for key, value in asked.items()}
    if cut:
        whole = compact_json(asked).encode("utf-8", "surrogatepass")
        kept["request_sha256"] = hashlib.sha256(whole).hexdigest()
    return kept


class ReadLimiter:
    """A token bucket per caller: ``rate`` reads a second on average, ``burst`` at once."""

    def __init__(
        self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def admit(self, caller: str) -> float | None:
        """Take one read from ``caller``'s bucket; None when admitted, else the
        seconds until a read is available."""
        now = self._clock()
        with self._lock:
            tokens, then = self._buckets.get(caller, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.rate)
            if tokens < 1.0:
                self._buckets[caller] = (tokens, now)
                return (1.0 - tokens) / self.rate
            if caller not in self._buckets and len(self._buckets) >= MAX_TRACKED_CALLERS:
                self._forget_idle(now)
            self._buckets[caller] = (tokens - 1.0, now)
            return None

    def _forget_idle(self, now: float) -> None:
        # A bucket idle long enough to be full again holds nothing worth keeping.
        full_after = self.burst / self.rate
        for caller, (_, then) in list(self._buckets.items()):
            if now - then >= full_after:
                del self._buckets[caller]
        if len(self._buckets) >= MAX_TRACKED_CALLERS:
            self._buckets.clear()


@dataclass
class _Tally:
    """Refusals of one kind and caller in the current window, past the first."""

    first: AuditEvent
    count: int = 0
    since: str = field(default_factory=now_iso)
    actions: Counter[str] = field(default_factory=Counter)


class AuditReads:
    """The records of audit reads, and the tally of refusals recorded in summary."""

    def __init__(
        self,
        store: Store,
        limiter: ReadLimiter,
        *,
        window_s: float = REFUSAL_WINDOW_S,
    ) -> None:
        self.limiter = limiter
        self._store = store
        self._window_s = window_s
        self._tallies: dict[tuple[str, str | None], _Tally] = {}
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._closed = False

    def record(self, event: AuditEvent) -> None:
        """Commit an access record before the read is answered."""
        self._store.transact(lambda tx: tx.append_audit(event))

    def refused(
        self, key: tuple[str, str | None], event: Callable[[], AuditEvent], *, action: str
    ) -> None:
        """A refusal of kind ``key`` (status, caller): the first of a window is
        recorded at once (``event`` builds its record), the others are counted
        into one summary at the window's end, their records never built. So a
        caller who has not authenticated costs no fsync and no storage each
        (audit reads, and Begins without a valid service token alike)."""
        with self._lock:
            if not self._closed:
                tally = self._tallies.get(key)
                if tally is None and len(self._tallies) >= MAX_TRACKED_CALLERS:
                    key = (key[0], None)  # fold the callers together
                    tally = self._tallies.get(key)
                if tally is not None:
                    tally.count += 1
                    tally.actions[action] += 1
                    return
        first = event()
        with self._lock:
            if not self._closed and key not in self._tallies:
                self._tallies[key] = _Tally(first=first)
                self._schedule()
        self.record(first)

    def flush(self) -> None:
        """Record a summary of every window's refusals past the first, now."""
        with self._lock:
            tallies, self._tallies = self._tallies, {}
            self._timer = None
        summaries = [_summary(t) for t in tallies.values() if t.count]
        if not summaries:
            return
        for summary in summaries:
            log.warning("%s", summary.reason)

        def work(tx: Any) -> None:
            for summary in summaries:
                tx.append_audit(summary)

        self._store.transact(work)

    def close(self) -> None:
        """Stop tallying and record what was tallied."""
        with self._lock:
            self._closed = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self.flush()

    def _schedule(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self._window_s, self._flush_quietly)
            self._timer.name = "warden-audit-refusals"
            self._timer.daemon = True
            self._timer.start()

    def _flush_quietly(self) -> None:
        try:
            self.flush()
        except Exception:
            log.exception("could not record the summary of refused audit reads")


def _summary(tally: _Tally) -> AuditEvent:
    first = tally.first
    what = {"rejected": "unauthenticated", "limited": "rate-limited"}.get(
        first.status, first.status
    )
    calls = "reads" if first.kind == "access" else "Begins"
    prefix = "audit" if first.kind == "access" else "begin"
    return AuditEvent(
        kind=first.kind,
        status=first.status,
        service=first.service,
        actor_id=first.actor_id,
        tenant=first.tenant,
        surface=first.surface,
        stage=first.stage,
        code=first.code,
        policy_revision=first.policy_revision,
        input=compact_json(
            {"refused": tally.count, "since": tally.since, "actions": dict(tally.actions)}
        ),
        reason=(
            f"{prefix}.refused: {tally.count} more {what} {calls} since {tally.since} "
            "(recorded together)"
        ),
    )
