"""Prometheus metrics of one plane, in a registry of its own.

Labels are stages, codes, statuses, RPC methods and pipeline steps: bounded
sets, never ids, inputs or messages (SI-5). A code is a label value only when
it is built in or declared by the capability it was reported for; any other
code a service reports folds into ``undeclared``, so no caller can grow the
exposition without bound.
"""

from __future__ import annotations

import bisect
import logging
import socketserver
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from warden.shared.codes import CODES
from warden_server.addresses import metrics_address
from warden_server.records.events import AuditEvent

log = logging.getLogger(__name__)

NONE: Final = "none"
"""The label value for an absent stage or code (a grant has neither)."""
UNDECLARED: Final = "undeclared"
"""The label value for a reported code that is neither built in nor declared
by the capability (see ``Metrics.declared_codes``)."""

LimitUsage = Callable[[], Sequence[tuple[str, float, int]]]
"""The usage of each limit in force: ``(limit id, the fullest key's share
of the limit, keys with usage)``, read from the store at scrape time."""
LIMIT_REASONS: Final = ("limited-by:", "over-whole-budget:")
"""The decision reasons that name the limit which refused a call."""

DeclaredCodes = Callable[[str, str], Collection[str]]
"""The codes a capability version declares: ``(capability_id, version) -> codes``."""


def _none_declared(capability_id: str, version: str) -> Collection[str]:
    return ()


_LATENCY_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
_BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Series:
    """The series of a labelled counter, each looked up once: ``labels()``
    takes a lock and builds a key every call, and these are counted on every
    request. Label values are bounded sets (see above), so is this cache."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: Counter) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Counter] = {}

    def __call__(self, *values: str) -> Counter:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class LatencySeries:
    """One labelled series of a ``LatencyHistogram``."""

    __slots__ = ("_bounds", "_counts", "_lock", "_sum", "created")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self._sum = 0.0
        self._lock = threading.Lock()
        self.created = time.time()

    def observe(self, seconds: float) -> None:
        # The bucket of the first bound at or above the value (``le``).
        where = bisect.bisect_left(self._bounds, seconds)
        with self._lock:
            self._counts[where] += 1
            self._sum += seconds

    def read(self) -> tuple[list[int], float]:
        """The count in each bucket (not cumulative) and the sum."""
        with self._lock:
            return list(self._counts), self._sum


class LatencyHistogram(Collector):
    """A latency histogram observed on every request, exposed as
    ``prometheus_client.Histogram`` exposes one (``_bucket``, ``_count``,
    ``_sum``, ``_created``).

    ``Histogram.observe`` takes two locks and walks its bounds in Python: with
    a sample per pipeline step and per RPC, that and the call's observation
    came to about a tenth of a ``Begin``'s CPU under load (docs/performance.md,
    item 45). Here an observation is a binary
    search and one lock; the buckets add up when the registry is read.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = tuple(labels)
        self._bounds = tuple(sorted(buckets))
        self._series: dict[tuple[str, ...], LatencySeries] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def series(self, *values: str) -> LatencySeries:
        """The series of these label values (made on first use)."""
        found = self._series.get(values)
        if found is None:
            if len(values) != len(self._labels):
                raise ValueError(f"{self._name} takes labels {self._labels}, not {values}")
            with self._lock:
                found = self._series.setdefault(values, LatencySeries(self._bounds))
        return found

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self._name, self._documentation, labels=self._labels)]

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labels)
        with self._lock:
            series = list(self._series.items())
        for values, one in series:
            counts, total = one.read()
            cumulative, buckets = 0, []
            for bound, count in zip((*self._bounds, float("inf")), counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            family.add_metric(list(values), buckets, total)
            labels = dict(zip(self._labels, values, strict=True))
            family.samples.append(Sample(f"{self._name}_created", labels, one.created))
        return [family]


class Metrics:
    """Every metric the plane exports."""

    def __init__(self) -> None:
        self.declared_codes: DeclaredCodes = _none_declared
        """Where the codes a capability declares are looked up (the plane's registry)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "warden_decisions",
            "Begin decisions by the stage and code that refused them (none for a grant).",
            ["stage", "code", "status"],
            registry=r,
        )
        self.outcomes = Counter(
            "warden_outcomes",
            "Reported outcomes of granted invocations by stage, code and status.",
            ["stage", "code", "status"],
            registry=r,
        )
        self.rpc_seconds = LatencyHistogram(
            "warden_rpc_duration_seconds",
            "Time to answer an RPC, by method and gRPC status code.",
            ["method", "code"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_seconds = LatencyHistogram(
            "warden_stage_duration_seconds",
            "Time spent in one pipeline step, by stage and step.",
            ["stage", "step"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.policy_reloads = Counter(
            "warden_policy_reloads",
            "Policy set loads, at start and on reload, by result (ok: swapped in; "
            "failed: refused, the last good set stays).",
            ["result"],
            registry=r,
        )
        self.processes_replaced = Counter(
            "warden_processes_replaced",
            "Processes of the plane started in place of one that ended while it served "
            "([server] processes).",
            registry=r,
        )
        self.commit_batch = Histogram(
            "warden_audit_commit_batch_size",
            "Transactions committed together by one fsync (group commit).",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "warden_audit_commit_duration_seconds",
            "Time to commit one batch of audit transactions.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # python_gc_collections_total{generation} and the objects collected:
        # how often the collector paused the process (processes.prepare_collector).
        GCCollector(registry=r)
        self._decision_series = Series(self.decisions)
        self._outcome_series = Series(self.outcomes)

        self.limit_refusals = Counter(
            "warden_limit_refusals",
            "Calls a policy limit refused, by limit id (never by key).",
            ["limit"],
            registry=r,
        )
        self.limit_usage: LimitUsage = tuple
        """Where the usage of the limits in force is read (the plane's store)."""
        r.register(_LimitGauges(self))
        self.policy_revision: Callable[[], str | None] = lambda: None
        """The revision of the policy set this process serves (its holder's)."""
        r.register(_RevisionGauge(self))

    def stage_seconds_of(self, stage: str, step: str) -> LatencySeries:
        """The ``stage_seconds`` series of one step."""
        return self.stage_seconds.series(stage, step)

    def committed(self, transactions: int, events: Sequence[AuditEvent], seconds: float) -> None:
        """Count a committed batch and the records in it."""
        self.commit_batch.observe(transactions)
        self.commit_seconds.observe(seconds)
        for event in events:
            series = (
                self._decision_series
                if event.kind == "decision"
                else self._outcome_series
                if event.kind == "outcome"
                else None
            )
            if series is not None:
                series(event.stage or NONE, self._code_label(event), event.status).inc()
                reason = event.reason or ""
                if event.kind == "decision" and reason.startswith(LIMIT_REASONS):
                    self.limit_refusals.labels(limit=reason.partition(":")[2]).inc()
            elif event.kind == "policy":
                self._policy_recorded(event)

    def _code_label(self, event: AuditEvent) -> str:
        code = event.code
        if code is None:
            return NONE
        if code in CODES:
            return code
        try:
            declared = self.declared_codes(
                event.capability_id or "", event.capability_version or ""
            )
        except Exception:
            log.exception("could not read the declared errors of %s", event.capability_id)
            declared = ()
        return code if code in declared else UNDECLARED

    def _policy_recorded(self, event: AuditEvent) -> None:
        # Every load and refusal of the policy folder, at start or on reload,
        # is recorded once before it takes effect: counting the records counts
        # the reloads wherever they happen.
        if event.status != "loaded" or event.policy_revision is None:  # "rejected"
            self.policy_reloads.labels(result="failed").inc()
            return
        self.policy_reloads.labels(result="ok").inc()

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format, as ``/metrics`` serves it."""
        return bytes(generate_latest(self.registry))


class _RevisionGauge(Collector):
    """The revision this process serves, read when scraped: each process
    swaps its own set, so the plane's figure (merged over its processes) shows
    every revision in force, one once every process has reloaded."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "warden_policy_revision_info",
            "The policy revision in force (value 1).",
            labels=["revision"],
        )
        revision = self._metrics.policy_revision()
        if revision is not None:
            family.add_metric([revision], 1)
        return [family]


class _LimitGauges(Collector):
    """The usage of each limit in force, labelled by limit id alone."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        fullest = GaugeMetricFamily(
            "warden_limit_usage_ratio",
            "The share of a policy limit its busiest key uses now (0 to 1).",
            labels=["limit"],
        )
        keys = GaugeMetricFamily(
            "warden_limit_keys_in_use", "Keys with usage under a policy limit.", labels=["limit"]
        )
        try:
            usage = self._metrics.limit_usage()
        except Exception:
            log.exception("could not read the usage of the policy limits")
            usage = ()
        for limit_id, ratio, count in usage:
            fullest.add_metric([limit_id], ratio)
            keys.add_metric([limit_id], count)
        return [fullest, keys]


class MetricsEndpoint:
    """The HTTP server for ``/metrics``, on its own thread.

    With ``peers`` (the ``/metrics`` ports of the plane's other processes),
    it serves the plane's figures whole: counters and histograms summed over
    every process, gauges at their largest.
    """

    def __init__(
        self, metrics: Metrics, listen: str, peers: Callable[[], Sequence[int]] = tuple
    ) -> None:
        registry = CollectorRegistry()
        registry.register(_Combined(metrics.registry, peers))
        family, _, _, address = metrics_address(listen)
        server_class = type("_MetricsServer", (_MetricsServer,), {"address_family": family})
        self._server: WSGIServer = make_server(
            address[0], address[1], make_wsgi_app(registry), server_class, _QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_S},
            name="warden-metrics",
            daemon=True,
        )
        self._thread.start()
        self.port: int = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


SHUTDOWN_POLL_S: Final = 0.05
"""How often the ``/metrics`` server looks whether it is told to stop. A stop
waits for that look: at the standard library's 0.5 s (which
``prometheus_client.start_http_server`` keeps), a one-process plane's stop
took 0.2 s and a two-process plane's 0.7 s, nearly all of it waiting here."""


class _MetricsServer(socketserver.ThreadingMixIn, WSGIServer):
    """Each scrape on a thread of its own, as ``prometheus_client`` serves them."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    """No line on stderr per scrape."""

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Combined(Collector):
    """This process's registry plus the expositions of the plane's other processes.

    Counters never go down, as Prometheus requires of them: a process that
    does not answer in time counts with what it last said, and what a process
    counted before it ended (or was replaced on its port) stays in the sums.
    """

    def __init__(self, own: CollectorRegistry, peers: Callable[[], Sequence[int]]) -> None:
        self._own = own
        self._peers = peers
        self._last: dict[int, str] = {}
        """Each peer's last exposition, by its metrics port."""
        self._departed: list[str] = []
        """The last expositions of processes that ended: their counts stay."""
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        texts = [generate_latest(self._own).decode()]
        with self._lock:
            ports = list(self._peers())
            for port in ports:
                text = _scrape(port)
                last = self._last.get(port)
                if text is None:
                    if last is not None:
                        texts.append(last)
                    continue
                if last is not None and _counted(text) < _counted(last):
                    self._departed.append(last)  # another process on the port
                self._last[port] = text
                texts.append(text)
            for port in [p for p in self._last if p not in ports]:
                self._departed.append(self._last.pop(port))
            departed = list(self._departed)
        return merge_expositions(texts, departed=departed)


def _scrape(port: int) -> str | None:
    """A peer's exposition, or None when it did not answer in time."""
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=PEER_SCRAPE_TIMEOUT_S
        ) as answer:
            return str(answer.read().decode())
    except OSError:
        # A process stopping, restarting or stalled: what it said last counts.
        log.warning("the plane process with metrics on port %d did not answer", port)
        return None


def _counted(text: str) -> float:
    """Everything an exposition's counters and histograms counted, together:
    lower than before only for a process that started afresh."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.type != "gauge"
        for sample in family.samples
        if not sample.name.endswith("_created")
    )


PEER_SCRAPE_TIMEOUT_S: Final = 2.0


def merge_expositions(texts: Iterable[str], *, departed: Iterable[str] = ()) -> list[Metric]:
    """Several processes' figures as one plane's: counters and histograms summed,
    gauges at their largest, ``_created`` at its earliest. The ``departed``
    (processes that ended) add their counters and histograms, not their gauges."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    sources = [(text, False) for text in texts] + [(text, True) for text in departed]
    for text, ended in sources:
        for family in text_string_to_metric_families(text):
            if ended and family.type == "gauge":
                continue
            merged = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type)
            )
            samples = values.setdefault(family.name, {})
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                known = samples.get(key)
                if known is None:
                    samples[key] = sample.value
                elif sample.name.endswith("_created"):
                    samples[key] = min(known, sample.value)
                elif merged.type == "gauge":
                    samples[key] = max(known, sample.value)
                else:
                    samples[key] = known + sample.value
    for name, merged in families.items():
        for (sample_name, labels), value in values[name].items():
            merged.add_sample(sample_name, dict(labels), value)
    return list(families.values())
