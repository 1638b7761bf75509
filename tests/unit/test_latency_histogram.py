"""``LatencyHistogram``: the request path's latency histograms read exactly as
``prometheus_client.Histogram`` would, for a fraction of its cost per
observation."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from warden_server.telemetry.metrics import LatencyHistogram

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.1, 1.0, 10.0)
# Below, on and above the bounds: ``le`` counts a value equal to the bound.
OBSERVED = {
    ("warden.v1.Governor/Begin", "OK"): [0.0, 0.0004, 0.0005, 0.0007, 0.001, 0.003, 2.5, 10.0],
    ("warden.v1.Governor/Complete", "INVALID_ARGUMENT"): [0.02, 11.0, 123.0],
}


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample but the ``_created`` times, by name and labels."""
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def test_it_exposes_what_a_prometheus_histogram_exposes() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = LatencyHistogram(
        "rpc_seconds", "Time per RPC.", ["method", "code"], buckets=BUCKETS, registry=ours
    )
    reference = Histogram(
        "rpc_seconds", "Time per RPC.", ["method", "code"], buckets=BUCKETS, registry=theirs
    )
    for labels, values in OBSERVED.items():
        for value in values:
            fast.series(*labels).observe(value)
            reference.labels(*labels).observe(value)
    assert samples(ours) == samples(theirs)
    created = [
        sample
        for family in text_string_to_metric_families(generate_latest(ours).decode())
        for sample in family.samples
        if sample.name == "rpc_seconds_created"
    ]
    assert len(created) == len(OBSERVED) and all(s.value > 0 for s in created)


def test_no_observation_is_lost_between_threads() -> None:
    registry = CollectorRegistry()
    histogram = LatencyHistogram(
        "step_seconds", "Per step.", ["step"], buckets=BUCKETS, registry=registry
    )
    series = histogram.series("policy")
    start = threading.Barrier(8)

    def observe() -> None:
        start.wait()
        for i in range(20_000):
            series.observe(i % 7 / 1000)

    threads = [threading.Thread(target=observe) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts, total = series.read()
    assert sum(counts) == 160_000
    assert total == pytest.approx(8 * sum(i % 7 / 1000 for i in range(20_000)))
    assert samples(registry)[("step_seconds_count", (("step", "policy"),))] == 160_000


def test_a_series_needs_every_label() -> None:
    histogram = LatencyHistogram(
        "step_seconds",
        "Per step.",
        ["stage", "step"],
        buckets=BUCKETS,
        registry=CollectorRegistry(),
    )
    with pytest.raises(ValueError, match="takes labels"):
        histogram.series("policy")
