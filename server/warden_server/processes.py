"""Serving on every core: the processes of one plane (``[server] processes``).

CPython runs one thread of Python at a time, so one process serves from one
core. The plane's first process binds the port with SO_REUSEPORT and starts
the others; each joins the port and the kernel spreads connections over
them. They are forked from a server process that has imported the plane once
(multiprocessing's forkserver), so a joining process starts in a tenth of a
second instead of importing everything anew. Each has its own policy set, store
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
at start through the forkserver's socket, never on a command line or in the
environment; when it goes away, so do they (a pipe from it closes). While it
serves, it replaces any of them that ends (``JoinedProcesses.supervise``).

Every process begins listening at once. The kernel hands a connection to one
of the sockets listening when it arrives, and gRPC keeps a connection for as
long as both ends live: a client that connected while the first process
listened alone would send all its calls there for good, however many
processes joined later. So the processes start together (``warden serve``
starts the others before it loads its own policy set, and they load theirs
meanwhile), each gets ready to serve without listening and says so
(``PREPARED``), and once all are ready the first tells them to listen
(``JoinedProcesses.listen``) and listens itself. Until then the port is held by sockets bound
to it but not listening (``app.start_others``), so that nothing else takes
it and no connection is accepted early.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Final, cast

from warden_server.config import Config
from warden_server.placement import pin_to
from warden_server.stopping import StopRequest

if TYPE_CHECKING:
    from warden_server.plane import ProcessSecrets

log = logging.getLogger(__name__)

PREPARED: Final = "prepared"
"""A joining process has loaded its plane and waits to be told to listen."""
READY: Final = "ready"
"""A joining process listens and serves."""
LISTEN: Final = "listen"
"""The first process's word to a prepared process: listen now."""
START_TIMEOUT_S: Final = 60.0


class ProcessStartError(OSError):
    """A joining process did not come up; the message carries what it said."""


_FORKSERVER = multiprocessing.get_context("forkserver")
_FORKSERVER.set_forkserver_preload(["warden_server.preload"])


def start_forkserver() -> None:
    """Start the server the joining processes are forked from, unless it runs:
    it imports the plane (most of a second) while the caller goes on."""
    multiprocessing.forkserver.ensure_running()


def stop_forkserver() -> None:
    """Stop the forkserver at once, even while it still imports the plane:
    a start that failed exits, and its forkserver must not hold the caller's
    stdout and stderr open for the rest of that import (a second or more).

    multiprocessing has no public way to stop it; ``_stop`` closes the pipe
    it watches and waits for it, which it reads only once its import is done,
    so it is killed first. Nothing has been forked from it that still needs it.
    """
    server = multiprocessing.forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    server._stop()  # type: ignore[attr-defined]


YOUNG_COLLECTION_THRESHOLD: Final = 10_000
"""Allocations of container objects, net of those freed, between two
collections of the youngest generation in a serving process (CPython's
default is 700)."""


def prepare_collector() -> None:
    """Set the garbage collector up for serving. Called where a serving
    process starts.

    - Every object alive now, the imported modules above all, is exempt from
      collection: they live as long as the process, and left to the collector
      every full collection while a large policy set loads would walk them
      again (about 0.2 s of a 5,000-rule start).
    - The youngest generation is collected after ``YOUNG_COLLECTION_THRESHOLD``
      allocations, not 700. The requests in flight hold about that many
      objects between them, so at 700 a young collection ran every 20 or so
      requests and moved whatever those requests still held to an older
      generation. That included grpc.aio's reference cycle around each call's
      handler lookup, which is freed only by a collection: it piled up in the
      oldest generation until a full collection every second or so paused
      the process for about 10 ms. Now a young collection runs every second
      or so, about 2 ms, and finds those cycles already dead
      (``docs/performance.md``, item 47).
    """
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD)


@dataclass
class _Joined:
    """One joined process, and our ends of its pipes.

    Its liveness is read from the process itself (a pidfd), not from what
    multiprocessing offers: a forkserver's child reads as ended whenever the
    forkserver does, and the forkserver ends on its own when it is killed or
    signalled with the whole process group (as a service manager stops a
    unit), while the processes it forked go on serving.
    """

    process: BaseProcess
    lifeline: Connection
    """The pipe it watches: it closes when we exit; the word to listen goes here."""
    ready: Connection | None
    """The pipe on which it says how its start goes, until it serves."""
    started_at: float
    metrics_port: int | None = None
    pidfd: int | None = None
    """A handle on the process, readable once it ends (None where the
    system has none: then the forkserver's word is all there is)."""

    @property
    def ended(self) -> int:
        """What reads as ready once the process ends, for ``connection.wait``."""
        return self.pidfd if self.pidfd is not None else self.process.sentinel

    def alive(self) -> bool:
        if self.pidfd is None:
            return self.process.is_alive()
        return not multiprocessing.connection.wait([self.pidfd], timeout=0)

    def send(self, signum: signal.Signals) -> None:
        """Send ``signum`` (SIGTERM or SIGKILL) to the process, unless it ended."""
        if self.pidfd is None and signum == signal.SIGTERM:
            self.process.terminate()
        elif self.pidfd is None:
            self.process.kill()
        else:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signum)

    def join(self, timeout: float | None = None) -> None:
        """Wait until the process ends, or ``timeout`` passes."""
        if self.pidfd is None:
            self.process.join(timeout)
        elif multiprocessing.connection.wait([self.pidfd], timeout):
            # Ended: its status too, from the forkserver that reaped it (at
            # once if that one is gone), so that multiprocessing forgets it.
            self.process.join(timeout=1)


def _pidfd(process: BaseProcess) -> int | None:
    """A pidfd of ``process`` (Linux 5.3 and later), or None."""
    if process.pid is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(process.pid)
    except OSError:  # no pidfds here, or it ended already: its sentinel says so
        return None


class JoinedProcesses:
    """The processes that joined a plane's first one.

    Once they serve, ``supervise`` keeps their number: one that ends while
    the plane serves (killed by the kernel for memory, say) is logged and
    replaced (``STOP_SETTLE_S`` later), and the new one listens at once beside
    the others. One that
    ended soon after it started waits a little longer each time before the
    next is started (``RESTART_PAUSES_S``), so a process that cannot live
    does not take the machine with it.
    """

    def __init__(self, spec: str, cpus: Sequence[int] | None) -> None:
        self._spec = spec
        self._cpus = cpus
        self._joined: list[_Joined] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self.metrics_ports: tuple[int, ...] = ()
        """Where each serves its ``/metrics`` on loopback, when the plane serves
        metrics (known once they listen)."""
        self.replaced = 0
        """How many processes were started in place of one that ended."""

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return [j.process.pid for j in self._joined if j.process.pid is not None]

    @classmethod
    def start(
        cls,
        config: Config,
        listen: str,
        count: int,
        secrets: ProcessSecrets,
        *,
        cpus: Sequence[int] | None = None,
    ) -> JoinedProcesses:
        """Start ``count`` processes that will serve ``listen`` with ``config``;
        returns at once, while they load. With ``cpus``, the i-th runs on
        ``cpus[i]``. Each waits, prepared, until ``listen()``.

        Raises:
            ProcessStartError: one could not be started (the others are stopped).
        """
        spec = json.dumps(
            {
                "config": config.model_dump(mode="json"),
                "listen": listen,
                "secrets": asdict(secrets),
                "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel()),
            }
        )
        started = cls(spec, cpus)
        try:
            for index in range(count):
                started._joined.append(started._spawn(index))
        except BaseException:
            started.stop(grace=0)
            raise
        return started

    def _spawn(self, index: int) -> _Joined:
        ready, ready_child = _FORKSERVER.Pipe(duplex=False)
        lifeline_child, lifeline = _FORKSERVER.Pipe(duplex=False)
        cpu = self._cpus[index] if self._cpus else None
        process = _FORKSERVER.Process(
            target=_join,
            args=(self._spec, ready_child, lifeline_child, cpu),
            name="warden-joined",
            # Should this process exit without stopping them (an error in
            # its stop), multiprocessing terminates them, which they drain on,
            # instead of waiting at the exit for processes nobody told to stop.
            daemon=True,
        )
        try:
            with _main_module_aside():
                process.start()
        except BaseException:
            for pipe in (ready, ready_child, lifeline, lifeline_child):
                pipe.close()
            raise
        ready_child.close()
        lifeline_child.close()
        return _Joined(process, lifeline, ready, time.monotonic(), pidfd=_pidfd(process))

    def listen(self) -> None:
        """Wait until every process has loaded its plane and waits to listen,
        then tell each to listen (``serving`` waits until they do).

        Raises:
            ProcessStartError: one did not get there (what it said, or how it
                ended), or went away before it heard.
        """
        for joined in self._joined:
            _await(joined, PREPARED)
        for joined in self._joined:
            _tell_to_listen(joined)

    def serving(self) -> None:
        """Wait until every process told to listen serves.

        Raises:
            ProcessStartError: one did not come to serve.
        """
        for joined in self._joined:
            _serving(joined)
        self._count_ports()

    def supervise(self, on_replaced: Callable[[tuple[int, ...]], None]) -> None:
        """Replace each process that ends from now on, until ``stop``. Once a
        new process serves, ``on_replaced`` hears where the processes serve
        ``/metrics`` now."""
        self._supervisor = threading.Thread(
            target=self._supervise,
            args=(on_replaced,),
            name="warden-process-supervisor",
            daemon=True,
        )
        self._supervisor.start()

    def _supervise(self, on_replaced: Callable[[tuple[int, ...]], None]) -> None:
        pauses = [0.0] * len(self._joined)
        while not self._stopping.is_set():
            with self._lock:
                sentinels = {j.ended: i for i, j in enumerate(self._joined)}
            for sentinel in multiprocessing.connection.wait(list(sentinels), timeout=1.0):
                if self._stopping.is_set():  # they end because the plane stops
                    return
                index = sentinels[cast(int, sentinel)]
                replaced = self.replaced
                pauses[index] = self._replace(index, pauses[index])
                if self.replaced > replaced:
                    on_replaced(self.metrics_ports)

    def _replace(self, index: int, pause: float) -> float:
        """Start a process in place of the ``index``-th, which ended, and let
        it serve; returns the pause to make before replacing that one again."""
        ended_at = time.monotonic()
        # A stop of the whole process group (a service manager's) ends the
        # other processes a moment before this one's handler asks the plane
        # to stop: a process ended by that stop is neither a failure nor
        # replaced.
        if self._stopping.wait(STOP_SETTLE_S):
            return pause
        with self._lock:
            if self._stopping.is_set():  # since: ``stop`` has taken the processes
                return pause
            old = self._joined[index]
        lived = ended_at - old.started_at
        old.join(timeout=0)  # it ended: this takes its status from the forkserver
        if lived < STABLE_AFTER_S:  # it could not live: wait longer each time
            pause = min(RESTART_PAUSES_S[1], max(pause * 2, RESTART_PAUSES_S[0]))
        else:
            pause = 0.0
        log.error(
            "process %d of the plane (pid %s) ended with status %s after %.0f s; "
            "starting another%s",
            index + 2,
            old.process.pid,
            old.process.exitcode,
            lived,
            f" in {pause:.0f} s" if pause else "",
        )
        if self._stopping.wait(pause):
            return pause
        try:
            joined = self._spawn(index)
        except (OSError, ValueError) as exc:
            log.error("starting a process of the plane failed: %s", exc)
            old.started_at = time.monotonic()  # tried again after a longer pause
            return pause
        with self._lock:
            kept = not self._stopping.is_set()
            if kept:
                self._joined[index] = joined
        if not kept:  # the plane stopped meanwhile
            joined.send(signal.SIGTERM)
            joined.join()
            _close(joined)
            return pause
        _close(old)
        try:
            _await(joined, PREPARED)
            _tell_to_listen(joined)
            _serving(joined)
        except ProcessStartError as exc:
            if not self._stopping.is_set():
                log.error("the process started in place of process %d failed: %s", index + 2, exc)
            return pause
        self.replaced += 1
        self._count_ports()
        log.warning("process %d of the plane serves again (pid %s)", index + 2, joined.process.pid)
        return pause

    def _count_ports(self) -> None:
        with self._lock:
            self.metrics_ports = tuple(
                j.metrics_port for j in self._joined if j.metrics_port is not None
            )

    def stop(self, grace: float | None = 2.0) -> None:
        """Stop every process, letting in-flight calls finish within ``grace``."""
        self._stopping.set()  # none is replaced from now on
        with self._lock:
            joined, self._joined = self._joined, []
        for each in joined:
            if each.alive():
                each.send(signal.SIGTERM)  # the process drains, then exits
        allowed_s = (grace or 0) + 10
        deadline = time.monotonic() + allowed_s
        for each in joined:
            each.join(timeout=max(0.1, deadline - time.monotonic()))
            if each.alive():
                log.warning(
                    "process %s did not stop within %g s of SIGTERM: killed",
                    each.process.pid,
                    allowed_s,
                )
                each.send(signal.SIGKILL)
                each.join()
            _close(each)
        if self._supervisor is not None:
            self._supervisor.join(timeout=10)


RESTART_PAUSES_S: Final = (1.0, 60.0)
"""The first and the longest pause before replacing a process that ended
within ``STABLE_AFTER_S`` of its start."""
STABLE_AFTER_S: Final = 30.0
"""A process that lived this long is replaced at once when it ends."""
STOP_SETTLE_S: Final = 1.0
"""How long a process that ended waits to be taken for a failure: the time
the plane's own stop may take to follow a signal sent to every process of it."""


def _tell_to_listen(joined: _Joined) -> None:
    try:
        joined.lifeline.send(LISTEN)
    except OSError as exc:
        raise ProcessStartError(f"a joining process went away: {exc}") from None


def _serving(joined: _Joined) -> None:
    said = _await(joined, READY)
    joined.metrics_port = int(said) if said else None
    if joined.ready is not None:
        joined.ready.close()
        joined.ready = None


def _close(joined: _Joined) -> None:
    with contextlib.suppress(ValueError):  # closed already, or its forkserver has not said
        joined.process.close()
    if joined.pidfd is not None:
        os.close(joined.pidfd)
        joined.pidfd = None
    for pipe in (joined.lifeline, joined.ready):
        if pipe is not None:
            pipe.close()


@contextmanager
def _main_module_aside() -> Iterator[None]:
    """Start a process without it re-running the starter's ``__main__``, as
    multiprocessing otherwise does: a joining process needs nothing from the
    program that embeds the plane, and a script without an
    ``if __name__ == "__main__"`` guard would start itself again."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _await(joined: _Joined, expected: str) -> str:
    """What the process said with ``expected`` (its ``/metrics`` port, once
    it serves), once it says it.

    Raises:
        ProcessStartError: it said it failed, ended, or said nothing in time.
    """
    ready, process = joined.ready, joined.process
    assert ready is not None, "the process said all it had to say"
    if not ready.poll(START_TIMEOUT_S):
        raise ProcessStartError(f"a joining process did not start in {START_TIMEOUT_S:.0f} s")
    try:
        word, said = ready.recv()
    except EOFError:
        process.join(timeout=1)
        raise ProcessStartError(
            f"a joining process did not start: it exited with status {process.exitcode}"
        ) from None
    if word == expected:
        return str(said)
    raise ProcessStartError(f"a joining process did not start: {said}")


def _join(spec_text: str, ready: Connection, lifeline: Connection, cpu: int | None) -> None:
    """A process joining a plane (on ``cpu``, when given): load, wait for the
    word to listen, then serve until told to stop, or until the first process
    is gone."""
    if cpu is not None:
        pin_to(cpu)  # before any thread of the plane starts: they inherit it
    from warden_server.app import serve
    from warden_server.plane import Plane, ProcessSecrets
    from warden_server.reload import announce_joined
    from warden_server.telemetry.logs import configure_logging

    spec = json.loads(spec_text)
    config = Config.model_validate(spec["config"])
    configure_logging(spec["log_level"], config.telemetry.log_format)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C reaches the first process
    prepare_collector()

    def told_to_listen() -> None:
        ready.send((PREPARED, ""))
        if lifeline.recv() != LISTEN:  # EOFError: the first process is gone
            raise ProcessStartError("the first process said something else than to listen")
        # The first process announced its set before it said so: this one
        # announces its own only if it differs (the folder changed meanwhile).
        announce_joined(plane.store, plane.policies.current())

    try:
        plane = Plane.from_config(config, joined=True, secrets=ProcessSecrets(**spec["secrets"]))
        server = serve(plane, spec["listen"], before_listening=told_to_listen)
    except (EOFError, BrokenPipeError):
        sys.exit(1)  # the first process went away while this one started
    except Exception as exc:
        with contextlib.suppress(OSError):
            ready.send(("failed", str(exc)))
        sys.exit(1)
    try:
        ready.send((READY, str(server.metrics_port or "")))
    except OSError:  # the first process went away while this one started
        server.stop(grace=0)
        return
    ready.close()
    request = StopRequest()  # answered here, on the main thread (``warden_server.stopping``)
    signal.signal(signal.SIGTERM, request.handle)

    def orphaned() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()  # nothing more is sent: this returns when the first process is gone
        request.make("the first process is gone")

    threading.Thread(target=orphaned, name="warden-parent-watch", daemon=True).start()
    try:
        server.wait(until=request.made)
    finally:
        server.stop()
