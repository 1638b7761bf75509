"""Policy limits at run time: whether a call fits, and what it takes.

A rate limit is a token bucket kept as one number per key, the moment the
bucket is full again (the generic cell rate algorithm): a call adds one
token's time to it, and fits while the bucket is not over its size. A
budget sums what granted calls hold over its window; a concurrency cap
counts the calls between grant and outcome. Holds end by themselves (the
window passes, the grant expires) or when an outcome gives them back.

Everything here runs inside the write transaction that records the decision
(``WriteTransaction``), so what one process admits every other one sees
before it decides: N processes or replicas never admit more than a limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from warden_server.errors import NotFound
from warden_server.policy.engine import CompiledLimit, LimitCall, PolicySet
from warden_server.store import LimitHold, LimitUsage
from warden_server.store.base import LimitReads, LimitWrites

CONCURRENCY_BACKOFF_MS: Final = 1_000
"""How long a call refused by a concurrency cap is told to wait: a slot
frees when another call's outcome arrives, which no clock predicts."""
_SLACK: Final = 1e-6
"""Seconds (or units of cost) of rounding forgiven when comparing."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A call a limit does not admit now."""

    call: LimitCall
    retry_after_ms: int
    """When the call would fit, from now (0 when it never will)."""
    never: bool = False
    """The call costs more than the whole budget: no wait makes it fit."""

    @property
    def limit_id(self) -> str:
        return self.call.limit.id

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.limit_id, "kind": self.call.limit.kind}
        if self.never:
            data["over_whole_budget"] = True
        else:
            data["retry_after_ms"] = self.retry_after_ms
        return data


@dataclass(frozen=True, slots=True)
class Admission:
    """What the limits said of one call."""

    refusal: Refusal | None
    """The enforced limit that refuses the call (the one that never fits,
    else the longest wait), or None when the call is admitted."""
    would_have: tuple[Refusal, ...] = ()
    """Audit-mode limits that would have refused it."""


def judge(call: LimitCall, usage: LimitUsage, now: float) -> Refusal | None:
    """Whether ``call`` fits ``usage`` at ``now`` (seconds since the epoch)."""
    limit = call.limit
    capacity = limit.capacity
    if limit.kind == "rate":
        interval = limit.period_seconds
        full_at = max(usage.bucket or now, now) + interval
        over = full_at - now - capacity * interval
        return None if over <= _SLACK else Refusal(call, _ms(over))
    used = sum(hold.amount for hold in usage.holds)
    if limit.kind == "concurrency":
        return None if used < capacity else Refusal(call, CONCURRENCY_BACKOFF_MS)
    if call.cost > capacity + _SLACK:
        return Refusal(call, 0, never=True)
    if used + call.cost <= capacity + _SLACK:
        return None
    for hold in usage.holds:  # soonest to end first
        used -= hold.amount
        if used + call.cost <= capacity + _SLACK:
            return Refusal(call, _ms(hold.until - now))
    return Refusal(call, _ms(usage.holds[-1].until - now) if usage.holds else 0)


def admit(
    tx: LimitWrites,
    calls: Sequence[LimitCall],
    *,
    invocation_id: str,
    now: float,
    grant_expires: float,
) -> Admission:
    """Judge every limit a call counts against, and when the enforced ones
    all admit it, take what it uses of each (audit-mode limits included,
    unless they would have refused it: their counts mirror enforcement)."""
    usages = {id(call): tx.limit_usage(call.limit.id, call.key, now) for call in calls}
    refusals = {id(call): judge(call, usages[id(call)], now) for call in calls}
    enforced = [r for c in calls if c.limit.enforced and (r := refusals[id(c)]) is not None]
    would_have = tuple(
        r for c in calls if not c.limit.enforced and (r := refusals[id(c)]) is not None
    )
    if enforced:
        return Admission(strongest(enforced), would_have)
    for call in calls:
        if refusals[id(call)] is None:
            _take(tx, call, usages[id(call)], invocation_id, now, grant_expires)
    return Admission(None, would_have)


def strongest(refusals: Sequence[Refusal]) -> Refusal:
    """The refusal a caller hears: one that never fits, else the longest wait."""
    return max(refusals, key=lambda r: (r.never, r.retry_after_ms))


def give_back(tx: LimitWrites, invocation_id: str, *, handler_ran: bool, succeeded: bool) -> None:
    """An outcome arrived: the call no longer runs, and when its handler never
    ran, it spent nothing of its budgets either."""
    kinds = ["concurrency"]
    if not succeeded and not handler_ran:
        kinds.append("budget")
    tx.release_limit_holds(invocation_id, kinds)


def _take(
    tx: LimitWrites,
    call: LimitCall,
    usage: LimitUsage,
    invocation_id: str,
    now: float,
    grant_expires: float,
) -> None:
    limit = call.limit
    if limit.kind == "rate":
        full_at = max(usage.bucket or now, now) + limit.period_seconds
        tx.set_limit_bucket(limit.id, call.key, full_at)
        return
    if limit.kind == "concurrency":
        amount, until = 1.0, grant_expires
    else:
        amount, until = call.cost, window_end(limit.period_seconds, limit.limit.window, now)
    tx.hold_limit(LimitHold(limit.id, call.key, invocation_id, limit.kind, amount, now, until))


def window_end(seconds: float, window: str, now: float) -> float:
    """When a cost spent at ``now`` leaves a budget's window: a period later
    (sliding), or at the start of the next UTC second, minute, hour or day
    (calendar)."""
    if window == "sliding":
        return now + seconds
    return (math.floor(now / seconds) + 1) * seconds


def prior_usage(limit: CompiledLimit, used: float, now: float) -> LimitUsage:
    """A key's state after ``used`` of a limit was spent just before ``now``
    (what a policy test case's ``usage`` sets)."""
    if limit.kind == "rate":
        return LimitUsage(limit.id, "", now + used * limit.period_seconds if used else None)
    if not used:
        return LimitUsage(limit.id, "", None)
    until = now + (limit.period_seconds or 3600.0)
    if limit.kind == "budget":
        return LimitUsage(
            limit.id, "", None, (LimitHold(limit.id, "", "prior", "budget", used, now, until),)
        )
    running = range(math.ceil(used))
    return LimitUsage(
        limit.id,
        "",
        None,
        tuple(LimitHold(limit.id, "", f"p{n}", "concurrency", 1.0, now, until) for n in running),
    )


def epoch(moment: datetime) -> float:
    return moment.astimezone(UTC).timestamp()


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


@dataclass(frozen=True, slots=True)
class KeyUsage:
    key: str
    used: float
    next_release_ms: int


@dataclass(frozen=True, slots=True)
class LimitStatus:
    """One limit in force and the usage of its keys (``warden limits status``)."""

    limit_id: str
    kind: str
    mode: str
    capacity: float
    period_seconds: float
    file: str
    line: int
    keys: tuple[KeyUsage, ...]


class UnknownLimit(NotFound):
    """No limit of the policy set in force has this id."""


def usage_report(
    policies: PolicySet, store: LimitReads, now: float, limit_id: str = "", key: str | None = None
) -> list[LimitStatus]:
    """The usage of every limit in force (or of ``limit_id``), per key (or of ``key``).

    Raises:
        UnknownLimit: ``limit_id`` names no limit in force.
    """
    chosen = list(policies.limits)
    if limit_id:
        found = policies.limit(limit_id)
        if found is None:
            known = ", ".join(sorted(limit.id for limit in policies.limits)) or "none"
            raise UnknownLimit(f"no limit {limit_id!r} in force (limits: {known})")
        chosen = [found]
    report = []
    for limit in chosen:
        keys = []
        for usage in store.limit_usages(limit.id, key, now):
            used = used_of(limit, usage, now)
            if used <= 0 and key is None:
                continue
            keys.append(KeyUsage(usage.limit_key, used, _next_release_ms(limit, usage, now)))
        report.append(
            LimitStatus(
                limit_id=limit.id,
                kind=limit.kind,
                mode=limit.limit.mode,
                capacity=limit.capacity,
                period_seconds=limit.period_seconds,
                file=limit.file,
                line=limit.line,
                keys=tuple(keys),
            )
        )
    return report


def used_of(limit: CompiledLimit, usage: LimitUsage, now: float) -> float:
    """How much of a limit a key uses now: tokens spent (rate), cost spent
    in the window (budget) or calls running (concurrency)."""
    if limit.kind == "rate":
        if usage.bucket is None:
            return 0.0
        return min(limit.capacity, max(0.0, usage.bucket - now) / limit.period_seconds)
    return sum(hold.amount for hold in usage.holds)


def _next_release_ms(limit: CompiledLimit, usage: LimitUsage, now: float) -> int:
    if limit.kind == "rate":
        if usage.bucket is None or usage.bucket <= now:
            return 0
        spent = (usage.bucket - now) / limit.period_seconds
        return _ms((spent - math.floor(spent - _SLACK)) * limit.period_seconds)
    return _ms(usage.holds[0].until - now) if usage.holds else 0


def usage_gauges(
    policies: PolicySet, store: LimitReads, now: float
) -> list[tuple[str, float, int]]:
    """For ``/metrics``: each limit in force, the share of it its busiest key
    uses, and how many keys use it (of the first hundred)."""
    gauges = []
    for status in usage_report(policies, store, now):
        fullest = max((k.used for k in status.keys), default=0.0)
        ratio = fullest / status.capacity if status.capacity else 0.0
        gauges.append((status.limit_id, min(1.0, ratio), len(status.keys)))
    return gauges
