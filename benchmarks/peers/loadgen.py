"""Drive one target with the C generator (``benchmarks/loadgen/grpcload.c``)
for one measurement point, and sample the server's CPU over the same window.

The generator prints ``start`` and ``end`` around its measured window, so the
server's CPU is read at those moments, not around the warmup or the drain.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.peers import cpu
from benchmarks.peers.targets import Target


class LoadError(Exception):
    """The generator could not run (not: some requests failed — those are counted)."""


def measure(
    binary: Path, target: Target, *, inflight: int, duration: float, warmup: float
) -> dict[str, Any]:
    """One point: ``inflight`` requests in flight for ``duration`` seconds.

    Returns the generator's JSON result with ``server_cpu_cores`` added,
    ``other_cpu_cores`` (what the rest of the machine used meanwhile), and
    for each process serving the port, busiest first
    (``cpu.serving_processes``, read as the window starts):
    ``connections_by_process`` and ``cpu_cores_by_process``.
    """
    with tempfile.NamedTemporaryFile(suffix=".bin") as body:
        body.write(target.template)
        body.flush()
        command = [
            str(binary),
            "--port",
            str(target.port),
            "--path",
            target.path,
            "--body",
            body.name,
            "--id-offset",
            str(target.id_offset),
            "--id-length",
            "36",
            "--id-mode",
            "uuid",
            "--inflight",
            str(inflight),
            "--connections",
            str(connections_for(inflight)),
            "--duration",
            str(duration),
            "--warmup",
            str(warmup),
        ]
        for header in target.headers:
            command += ["--header", header]
        generator = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert generator.stdout is not None
        marks: dict[str, tuple[float, float, float]] = {}
        serving: list[cpu.Serving] = []
        by_process: dict[str, list[float]] = {}
        result: dict[str, Any] | None = None
        for printed in generator.stdout:
            line = printed.strip()
            if line in ("start", "end"):
                if line == "start":  # the generator has connected and warmed up
                    serving = cpu.serving_processes(target.process.pid, target.port)
                by_process[line] = [cpu.process_seconds(each.pid) for each in serving]
                marks[line] = (
                    time.monotonic(),
                    cpu.tree_seconds(target.process.pid),
                    cpu.machine_busy_seconds(),
                )
            elif line.startswith("{"):
                result = json.loads(line)
        stderr = generator.stderr.read() if generator.stderr else ""
        generator.wait()
    if result is None:
        raise LoadError(f"the load generator printed no result: {stderr.strip()}")
    result["server_cpu_cores"] = result["other_cpu_cores"] = 0.0
    result["connections_by_process"] = [each.connections for each in serving]
    result["cpu_cores_by_process"] = [0.0] * len(serving)
    if "start" in marks and "end" in marks:
        (t0, s0, m0), (t1, s1, m1) = marks["start"], marks["end"]
        if t1 > t0:
            result["server_cpu_cores"] = (s1 - s0) / (t1 - t0)
            result["cpu_cores_by_process"] = [
                (end - start) / (t1 - t0)
                for start, end in zip(by_process["start"], by_process["end"], strict=True)
            ]
            machine = (m1 - m0) / (t1 - t0)
            others = machine - result["server_cpu_cores"] - result["cpu_cores"]
            result["other_cpu_cores"] = max(0.0, others)
    return result


def connections_for(inflight: int) -> int:
    """One connection per two requests in flight, as many callers would open.

    The kernel spreads connections, not requests, over the processes sharing
    a port (SO_REUSEPORT hashes each connection once): with a handful of
    connections one process can get most of them and the other sit idle,
    which measures the hash, not the servers.
    """
    return max(1, inflight // 2)
