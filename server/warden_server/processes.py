"""Serving on every core: the processes of one plane (``[server] processes``).

CPython runs one thread of Python at a time, so one process serves from one
core. The plane's first process binds the port with SO_REUSEPORT and starts
the others (``python -m warden_server.processes``); each joins the port and
the kernel spreads connections over them. Each has its own policy set, store
connections and threads; what they share lives in the store:

- the audit chain is one: a batch is appended under the store's write lock
  after reading the chain head inside the same transaction, so processes take
  turns extending one chain, each still committing many requests per fsync,
  and no grant leaves a process before its record is durable (SI-3);
- approvals, idempotency keys and invocation ids are rows every process
  reads and changes with conditional writes;
- watchers hear every process's approval changes from the audit log
  (``approvals/tail.py``);
- each process watches the policy folder, and a revision is announced in the
  log once, before any process decides with it; for a moment after a change
  (the watcher's debounce), processes may serve different revisions, and
  ``Policies.GetStatus`` reports the process that answers;
- the first process alone sweeps expired approvals and prunes; it serves
  ``/metrics`` for the plane, adding the figures of the others (each serves
  its own on a loopback port only the first one reads).

The first process hands the others its config and the keys it may have made
at start on their standard input, never on a command line or in the
environment; when it goes away, so do they (their standard input closes).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Final

from warden_server.config import Config

if TYPE_CHECKING:
    from warden_server.plane import ProcessSecrets

log = logging.getLogger(__name__)

READY: Final = "ready"
START_TIMEOUT_S: Final = 60.0


class ProcessStartError(OSError):
    """A joining process did not come up; the message carries what it said."""


class JoinedProcesses:
    """The processes that joined a plane's first one."""

    def __init__(self, processes: list[subprocess.Popen[str]]) -> None:
        self._processes = processes
        self.metrics_ports: tuple[int, ...] = ()
        """Where each serves its ``/metrics`` on loopback, when the plane serves metrics."""

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    @classmethod
    def start(
        cls, config: Config, listen: str, count: int, secrets: ProcessSecrets
    ) -> JoinedProcesses:
        """Start ``count`` processes serving ``listen`` with ``config``; returns
        once every one serves.

        Raises:
            ProcessStartError: one did not start (the others are stopped).
        """
        spec = json.dumps(
            {
                "config": config.model_dump(mode="json"),
                "listen": listen,
                "secrets": asdict(secrets),
                "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel()),
            }
        )
        started = cls([])
        try:
            for _ in range(count):
                process = subprocess.Popen(
                    [sys.executable, "-m", "warden_server.processes"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                started._processes.append(process)
                assert process.stdin is not None
                process.stdin.write(spec + "\n")
                process.stdin.flush()
            ports = [_await_ready(process) for process in started._processes]
            started.metrics_ports = tuple(p for p in ports if p is not None)
        except BaseException:
            started.stop(grace=0)
            raise
        return started

    def stop(self, grace: float | None = 2.0) -> None:
        """Stop every process, letting in-flight calls finish within ``grace``."""
        for process in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + (grace or 0) + 10
        for process in self._processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()
        self._processes = []


def _await_ready(process: subprocess.Popen[str]) -> int | None:
    """The process's ``/metrics`` port (None when it serves none), once it serves."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
    line = process.stdout.readline().strip() if ready else ""
    word, _, port = line.partition(" ")
    if word == READY:
        return int(port) if port else None
    if not ready:
        raise ProcessStartError(f"a joining process did not start in {START_TIMEOUT_S:.0f} s")
    code = process.poll()
    said = line.removeprefix("failed: ") or f"it exited with status {code}"
    raise ProcessStartError(f"a joining process did not start: {said}")


def main() -> None:
    """A process joining a plane: read the spec from stdin, serve until told to stop."""
    from warden_server.app import serve
    from warden_server.plane import Plane, ProcessSecrets
    from warden_server.telemetry.logs import configure_logging

    spec = json.loads(sys.stdin.readline())
    config = Config.model_validate(spec["config"])
    configure_logging(spec["log_level"], config.telemetry.log_format)
    try:
        plane = Plane.from_config(config, joined=True, secrets=ProcessSecrets(**spec["secrets"]))
        server = serve(plane, spec["listen"])
    except Exception as exc:
        print(f"failed: {exc}", flush=True)
        sys.exit(1)
    try:
        print(f"{READY} {server.metrics_port or ''}".strip(), flush=True)
    except BrokenPipeError:  # the first process went away while this one started
        server.stop(grace=0)
        return
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nobody reads the pipe from now on
    stopping = threading.Event()

    def stop(*_: object) -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.stop, name="warden-stop").start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C reaches the first process

    def orphaned() -> None:
        sys.stdin.read()  # returns when the first process is gone
        stop()

    threading.Thread(target=orphaned, name="warden-parent-watch", daemon=True).start()
    server.wait()


if __name__ == "__main__":
    main()
