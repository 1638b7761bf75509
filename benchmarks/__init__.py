"""Warden's benchmarks: ``make bench`` (``python -m benchmarks``).

Each ``bench_*`` module has a ``run(quick: bool = False) -> bool`` that
measures its speed targets, as ratios against a baseline measured in the same
run on the same machine where a target is relative, and returns False when a
target is missed; the run then fails. ``quick=True`` runs the same code at
tiny sizes in a few seconds and judges no figure: it returns True when the
benchmark ran correctly (``tests/benchmarks`` runs every module so, which
keeps them from rotting unseen).

Every run also writes its figures as JSON to ``var/bench/<name>.json``
(``<name>.quick.json`` in quick mode, so a smoke test never overwrites the
figures of a full run).

The helpers below start a plane as ``warden serve`` in its own process, as it
runs in production, and find the processes it consists of.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

RESULTS = Path(__file__).resolve().parent.parent / "var" / "bench"
"""Where each benchmark writes its figures as JSON."""


def machine() -> dict[str, Any]:
    """What the figures were measured on: runs on different machines (a
    shared one moves between hosts) compare only by their ratios."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            names = (line.split(":", 1)[1] for line in cpuinfo if line.startswith("model name"))
            model = next(names, "").strip()
    except OSError:  # not Linux
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model or platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def describe_machine() -> str:
    """``machine()`` in one line, for the head of a run."""
    m = machine()
    return f"{m['cpus']} CPUs ({m['cpu_model']}), Python {m['python']}, kernel {m['kernel']}"


def write_results(name: str, figures: dict[str, Any], *, ok: bool, quick: bool) -> Path:
    """Write a benchmark's figures to ``var/bench/<name>.json``, say where, and
    return the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}{'.quick' if quick else ''}.json"
    document = {
        "benchmark": name,
        "quick": quick,
        "ok": ok,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "machine": machine(),
        "figures": figures,
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print(f"  results: {_shown(path)}", flush=True)
    return path


def _shown(path: Path) -> str:
    """``path`` from the repository's root (where ``make bench`` runs), when it is inside."""
    try:
        return str(path.relative_to(RESULTS.parent.parent))
    except ValueError:
        return str(path)


def verdict(ok: bool, quick: bool) -> str:
    """How a target reads in a report: quick runs judge nothing."""
    if quick:
        return "(quick: not judged)"
    return "ok" if ok else "MISSED"


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``samples``, nearest rank."""
    ordered = sorted(samples)
    if not ordered:
        return math.nan
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[rank - 1]


# -- a plane in its own process -------------------------------------------------


def warden_command() -> list[str]:
    """The ``warden`` command of the running interpreter's environment."""
    script = Path(sys.executable).with_name("warden")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "warden_server.cli"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_plane(config: Path, port: int) -> subprocess.Popen[bytes]:
    """``warden serve --config CONFIG`` on 127.0.0.1:``port``, logs discarded,
    in a process group of its own (``os.killpg`` kills it with the processes
    that joined it)."""
    return subprocess.Popen(
        [
            *warden_command(),
            "serve",
            "--config",
            str(config),
            "--listen",
            f"127.0.0.1:{port}",
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


ECHO_POLICIES = """
rules:
  - id: members-may-echo
    capabilities: ["bench.*"]
    effect: allow
    when: '"member" in actor.roles && input.n >= 0'
  - id: no-big-numbers
    capabilities: ["bench.echo"]
    effect: deny
    when: input.n > 1000000
    message: "Use a smaller number."
"""
"""The policies of the end-to-end benchmarks' ``bench.echo`` capability."""


def stop_plane(process: subprocess.Popen[bytes]) -> None:
    """Stop a plane as an operator would (SIGTERM), and wait for it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def plane(config: Path) -> Iterator[str]:
    """A plane serving ``config`` until the block ends; yields its ``host:port``."""
    port = free_port()
    process = start_plane(config, port)
    try:
        target = f"127.0.0.1:{port}"
        wait_until_serving(target, process)
        yield target
    finally:
        stop_plane(process)


PROBE_OPTIONS = (
    # Reconnect on the scale of the polling. gRPC's default waits a second, then
    # 1.6 s, then 2.6 s between attempts to connect to a port nobody listens on
    # yet: a plane serving at 2.2 s would be seen at 2.6 s, one at 2.7 s at 5.2 s.
    ("grpc.initial_reconnect_backoff_ms", 10),
    ("grpc.max_reconnect_backoff_ms", 50),
    # Not grpc.min_reconnect_backoff_ms, which also bounds how long a connection
    # attempt may last (warden._transport.CHANNEL_OPTIONS).
)
"""The health probe's channel options: a restart is timed to when the plane
answers, not to when gRPC next tries to connect."""


def wait_until_serving(
    target: str, process: subprocess.Popen[Any] | None = None, seconds: float = 60
) -> None:
    """Poll the health service until it answers SERVING.

    Raises:
        RuntimeError: the process ended first.
        grpc.RpcError: no answer within ``seconds``.
    """
    deadline = time.monotonic() + seconds
    with grpc.insecure_channel(target, options=PROBE_OPTIONS) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"the plane exited with status {process.returncode}")
            try:
                answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.01)


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (Linux ``/proc``)."""
    found = [pid]
    for tid in _listdir(Path(f"/proc/{pid}/task")):
        children = Path(f"/proc/{pid}/task/{tid}/children")
        try:
            text = children.read_text()
        except OSError:
            continue
        for child in text.split():
            found += process_tree(int(child))
    return found


def resident_bytes(pid: int) -> int:
    """A process's resident memory (``VmRSS`` in ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
