"""Which CPU each process of a plane runs on (``warden_server/placement.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from warden_server import placement


@pytest.fixture
def four_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {6, 2, 3, 5})


def test_one_process_per_cpu_gets_one_cpu_each_in_order(four_cpus: None) -> None:
    assert placement.cpus_for(4, pin=True) == [2, 3, 5, 6]


@pytest.mark.parametrize(
    ("processes", "pin"),
    [(4, False), (1, True), (2, True), (8, True)],
    ids=["pinning-off", "one-process", "fewer-processes-than-cpus", "more-processes-than-cpus"],
)
def test_otherwise_the_kernel_places_the_processes(
    four_cpus: None, processes: int, pin: bool
) -> None:
    assert placement.cpus_for(processes, pin=pin) is None


def test_the_default_count_is_the_cpus_this_process_may_use(four_cpus: None) -> None:
    from warden_server.config import config_from_dict

    config = config_from_dict({"actors": {"hs256_secret": "test-only-" + "x" * 32}})
    assert config.process_count == 4


def test_pinning_moves_every_thread_and_the_threads_started_after() -> None:
    # In a process of its own: pinning the test runner would slow the suite.
    cpu = max(os.sched_getaffinity(0))
    script = f"""
import json, os, threading
from warden_server.placement import pin_to
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
pin_to({cpu})
after = threading.Thread(target=stop.wait); after.start()
cpus = {{t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}}
stop.set(); before.join(); after.join()
print(json.dumps(cpus))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    threads = json.loads(out)
    assert len(threads) >= 3
    assert all(cpus == [cpu] for cpus in threads.values()), threads


def test_a_cpu_the_process_may_not_use_leaves_it_where_it_was(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = os.sched_getaffinity(0)
    beyond = max(before) + 4096  # no machine here has it
    placement.pin_to(beyond)
    assert os.sched_getaffinity(0) == before
    assert f"cannot run on CPU {beyond}" in caplog.text
