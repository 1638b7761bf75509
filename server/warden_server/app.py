"""Build and run the gRPC server around a Plane.

The server is grpc.aio's, on an event loop with a thread of its own
(``ServerLoop``). ``Begin``, the call on every governed call's path, is a
coroutine on that loop, and an embedded store commits its records from the
same thread (``SQLiteStore.commit_on``): a request goes from the network to
its durable record and back without a hand-off between threads. Health
checks are answered on the loop too; every other method blocks and runs in
the server's thread pool (``[server] workers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # not in the stubs
from grpc_reflection.v1alpha import reflection

from warden.v1 import (
    approvals_pb2,
    approvals_pb2_grpc,
    audit_pb2,
    audit_pb2_grpc,
    governor_pb2,
    governor_pb2_grpc,
    grants_pb2,
    grants_pb2_grpc,
    policy_pb2,
    policy_pb2_grpc,
    registry_pb2,
    registry_pb2_grpc,
)
from warden_server.addresses import MetricsUnavailable, addresses, check_addresses, claim
from warden_server.approvals.expiry import Sweeper
from warden_server.approvals.tail import ApprovalTail
from warden_server.audit.anchors import AnchorPublisher
from warden_server.audit.checkpoint import CheckpointSigner
from warden_server.audit.retention import RetentionScheduler
from warden_server.config import Config
from warden_server.notifications import Notifier, start_notifier
from warden_server.placement import pin_to
from warden_server.plane import Plane, ProcessSecrets
from warden_server.policy.model import parse_duration
from warden_server.processes import JoinedProcesses
from warden_server.replicas import ReplicaMetrics, ReplicaReporter, live_replicas
from warden_server.services.approvals import ApprovalsServicer
from warden_server.services.audit import AuditServicer
from warden_server.services.governor import GovernorServicer
from warden_server.services.grants import GrantKeysServicer
from warden_server.services.policies import PoliciesServicer
from warden_server.services.registry import RegistryServicer
from warden_server.store import open_store
from warden_server.telemetry.interceptor import TelemetryInterceptor

log = logging.getLogger(__name__)

T = TypeVar("T")


class ServerLoop:
    """The event loop the gRPC server runs on, on a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="warden-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for what it returns."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        """Stop the loop once it has run what it was given, and end its thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


WAIT_TURN_S: Final = 0.25
"""How long ``Server.wait`` blocks at a time: at most this long between a
SIGTERM and its handler, whichever thread the kernel gave the signal to."""
SLOW_STOP_S: Final = 5.0
CLOSING_WAIT_S: Final = 5.0
"""How long a stop waits for grants being closed (``Plane.closing``)."""


@contextlib.contextmanager
def reported_if_slow(after_s: float, doing: str) -> Iterator[None]:
    """Log the stack of every thread of the process (code positions only, no
    values) if the block is still running ``after_s`` seconds after it began:
    a plane that does not stop says where it waits."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(after_s):
            log.warning(
                "%s has taken more than %g s; the threads of process %d are at:\n%s",
                doing,
                after_s,
                os.getpid(),
                _thread_stacks(),
            )

    threading.Thread(target=watch, name="warden-slow-watch", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _thread_stacks() -> str:
    frames = sys._current_frames()
    me = threading.get_ident()
    return "\n".join(
        f"thread {thread.name}:\n{''.join(traceback.format_stack(frames[thread.ident]))}"
        for thread in threading.enumerate()
        if thread.ident in frames and thread.ident != me
    )


SERVICE_NAMES = (
    governor_pb2.DESCRIPTOR.services_by_name["Governor"].full_name,
    registry_pb2.DESCRIPTOR.services_by_name["Registry"].full_name,
    policy_pb2.DESCRIPTOR.services_by_name["Policies"].full_name,
    approvals_pb2.DESCRIPTOR.services_by_name["Approvals"].full_name,
    grants_pb2.DESCRIPTOR.services_by_name["GrantKeys"].full_name,
    audit_pb2.DESCRIPTOR.services_by_name["Audit"].full_name,
)


@dataclass
class Server:
    """A running plane: the gRPC server, the port it bound and the plane behind it."""

    plane: Plane
    grpc_server: grpc.aio.Server
    loop: ServerLoop = field(repr=False)
    port: int
    host: str
    health: health_aio.HealthServicer = field(repr=False)
    sweeper: Sweeper | None = field(default=None, repr=False)
    metrics_port: int | None = None
    """The port of ``/metrics``, when ``[telemetry] metrics_listen`` is set."""
    retention: RetentionScheduler | None = field(default=None, repr=False)
    approval_tail: ApprovalTail | None = field(default=None, repr=False)
    joined: JoinedProcesses | None = field(default=None, repr=False)
    """The other processes serving this port, started by this (the first) one."""
    anchors: AnchorPublisher | None = field(default=None, repr=False)
    notifier: Notifier | None = field(default=None, repr=False)
    reporter: ReplicaReporter | None = field(default=None, repr=False)
    slow_stop_s: float = field(default=SLOW_STOP_S, repr=False)
    """A stop still going after this long logs where every thread of the process is."""
    _stopped: bool = field(default=False, repr=False)
    _ended: bool = field(default=False, repr=False)
    """The stop is done: the loop that would answer ``wait`` is gone."""

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, grace: float | None = 2.0) -> None:
        """Stop serving (letting in-flight calls finish within ``grace``), then close the store."""
        if self._stopped:
            return
        self._stopped = True
        try:
            with reported_if_slow(self.slow_stop_s, "stopping"):
                self._stop(grace)
        finally:
            self._ended = True

    def _stop(self, grace: float | None) -> None:
        self.plane.reloader.stopping()  # winds down while the rest stops
        if self.joined is not None:
            self.joined.stop(grace)
        self.loop.run(self.health.enter_graceful_shutdown())
        if self.sweeper is not None:
            self.sweeper.stop()
        self.plane.approval_events.close()  # watch streams end now, not at the grace's end
        self.loop.run(self.grpc_server.stop(grace))
        self.loop.run(_closed(self.plane.closing))  # while the store is open
        if self.approval_tail is not None:
            self.approval_tail.stop()
        if self.retention is not None:
            self.retention.stop()
        if self.anchors is not None:
            self.anchors.stop()
        if self.notifier is not None:
            self.notifier.stop()
        if self.reporter is not None:
            self.reporter.stop()
        self.plane.close()  # the store's last commits run on the loop
        self.loop.close()

    def wait(self, until: Callable[[], bool] | None = None) -> None:
        """Until the server has stopped (by ``stop``, from any thread: the
        loop may close before it answers), or ``until()`` is true (a stop was
        asked for: ``warden_server.stopping``), looking in turns of
        ``WAIT_TURN_S``.

        Python runs a signal's handler on the main thread once that thread
        runs again, and the kernel may hand SIGTERM to any thread of the
        process: waiting in one go, a main thread blocked on the loop would
        never run the handler, and the plane would serve on, deaf to it."""
        if self._stopped:
            return
        ended = asyncio.run_coroutine_threadsafe(
            self.grpc_server.wait_for_termination(), self.loop.loop
        )
        while not self._ended and (until is None or not until()):
            try:
                ended.result(timeout=WAIT_TURN_S)
            except futures.TimeoutError:
                continue
            return

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(grace=0.5)


async def _closed(closing: set[asyncio.Task[None]]) -> None:
    """Wait (a while) for the grants being closed whose calls a stop cut short."""
    if closing:
        await asyncio.wait(set(closing), timeout=CLOSING_WAIT_S)


def server_credentials(config: Config) -> grpc.ServerCredentials | None:
    """TLS for the plane's port when ``[server] tls_cert_file`` is set (and mutual
    TLS with ``tls_client_ca_file``); None serves plaintext.

    Raises:
        OSError: a certificate or key file cannot be read.
    """
    section = config.server
    if not section.tls_cert_file or not section.tls_key_file:
        return None
    key = config.path(section.tls_key_file).read_bytes()
    chain = config.path(section.tls_cert_file).read_bytes()
    client_ca = (
        config.path(section.tls_client_ca_file).read_bytes() if section.tls_client_ca_file else None
    )
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def launch(
    config: Config, *, cpus: Sequence[int] | None = None, addresses_checked: bool = False
) -> Server:
    """Load the plane ``config`` describes and serve it (``warden serve``).

    With several processes, the others start first and load their policy
    sets while this one loads its own, so that the plane serves on every
    process about as soon as one could alone. The addresses are checked first
    (``check_addresses``), unless the caller did (``addresses_checked``).

    Raises:
        PolicyLoadError: the policy folder has problems.
        ValueError, OSError, StoreError: as ``Plane.from_config`` and ``serve``.
    """
    if not addresses_checked:
        check_addresses(config)
    # A store that cannot be opened fails the start here, before a key is made
    # beside it or another process starts (this process opens it again below).
    open_store(config.store_url, config.store_path).close()
    secrets = ProcessSecrets.from_config(config)
    others = (
        start_others(config, config.server.listen, secrets, cpus=cpus)
        if config.process_count > 1
        else None
    )
    try:
        plane = Plane.from_config(config, secrets=secrets)
    except BaseException:
        if others is not None:
            others.stop()
        raise
    return serve(plane, cpus=cpus, others=others)


@dataclass
class Others:
    """The processes joining a plane's first one, started and loading, and the
    port they will share, held until the first process listens on it."""

    listen: str
    """The address they serve, its port chosen (when ``listen`` asked for any)."""
    joined: JoinedProcesses
    held: list[socket.socket]
    """Sockets bound to the port, not listening: nothing else takes it meanwhile."""

    def release(self) -> None:
        """Let go of the port (the first process listens on it now)."""
        for held in self.held:
            held.close()
        self.held = []

    def stop(self) -> None:
        """Stop the processes and let go of the port: the plane does not start."""
        self.joined.stop(grace=0)
        self.release()


def start_others(
    config: Config, listen: str, secrets: ProcessSecrets, *, cpus: Sequence[int] | None = None
) -> Others:
    """Hold ``listen`` (which ``_claim`` found free) and start the
    ``config.process_count - 1`` processes that join the first in serving it
    (on ``cpus[1:]``, when given); they load while the first goes on, and
    listen when ``serve`` says.

    Raises:
        OSError: the address is not available, or a process cannot be started.
    """
    held, listen = _hold(listen)
    try:
        joined = JoinedProcesses.start(
            config,
            listen,
            config.process_count - 1,
            secrets,
            cpus=cpus[1:] if cpus else None,
        )
    except BaseException:
        for socket_held in held:
            socket_held.close()
        raise
    return Others(listen, joined, held)


def serve(
    plane: Plane,
    listen: str | None = None,
    *,
    cpus: Sequence[int] | None = None,
    others: Others | None = None,
    before_listening: Callable[[], None] | None = None,
) -> Server:
    """Start serving ``plane`` on ``listen`` (``host:port``; port 0 picks a free one).

    With several processes (``[server] processes``), the first starts the
    others here, unless ``start_others`` started them already (``others``),
    and every process begins listening at once (``processes.py``): this
    returns once all of them serve. With ``cpus`` (``placement.cpus_for``:
    one per process), this process runs on the first and each other on the
    next. A joining process passes ``before_listening``: it runs once the
    server is ready, before it binds the port.

    Raises:
        OSError: the address cannot be bound, or a process did not start
            (MetricsUnavailable: the metrics address).
    """
    processes = plane.config.process_count
    if cpus:
        pin_to(cpus[0])
    if processes > 1 and not plane.joined and others is None:
        address = listen or plane.config.server.listen
        try:
            claim(address)
            others = start_others(plane.config, address, plane.secrets(), cpus=cpus)
        except OSError:
            plane.close()
            raise
    if others is not None:
        listen = others.listen
        before_listening = others.joined.listen
    listen = listen or plane.config.server.listen
    host = listen.rsplit(":", 1)[0]
    try:
        loop, server, health_servicer, port = _listening(plane, processes, listen, before_listening)
    except BaseException:
        if others is not None:
            others.stop()
        raise
    if others is not None:
        others.release()  # this process listens on the port now
    metrics_port = _serve_metrics(plane, loop, others)
    running = _started(
        plane,
        loop,
        server,
        health_servicer,
        f"{host}:{port}",
        metrics_port,
        others.joined if others is not None else None,
    )
    if others is not None:
        try:
            others.joined.serving()
        except BaseException:
            running.stop(grace=0)
            raise
        plane.telemetry.peer_metrics_ports = others.joined.metrics_ports

        def replaced(ports: tuple[int, ...]) -> None:
            plane.telemetry.peer_metrics_ports = ports
            plane.telemetry.metrics.processes_replaced.inc()

        others.joined.supervise(replaced)
    loop.run(_health_of_all(health_servicer, health_pb2.HealthCheckResponse.SERVING))
    log.info(
        "warden listening on %s:%d (policy revision %s, %s, pid %d, one of %d processes)",
        host,
        port,
        plane.policies.current().revision[:12],
        plane.policies.current().evaluator.name,
        os.getpid(),
        processes,
    )
    return running


def _serve_metrics(plane: Plane, loop: ServerLoop, others: Others | None) -> int | None:
    """Serve ``/metrics`` where the config says (a joining process: on a
    loopback port, which the first process reads); its port.

    Raises:
        MetricsUnavailable: the address cannot be served. Whatever fails, the
            plane's other processes stop first: left waiting to be told to
            stop, they would hold this one at its exit.
    """
    listen = plane.config.telemetry.metrics_listen
    if listen and plane.joined:
        listen = "127.0.0.1:0"  # read by the first process, which serves the sum
    try:
        return plane.telemetry.serve_metrics(listen) if listen else None
    except BaseException as exc:
        if others is not None:
            others.stop()
        plane.close()
        loop.close()
        if isinstance(exc, OSError | ValueError):
            raise MetricsUnavailable(listen or "", exc) from None
        raise


def _started(
    plane: Plane,
    loop: ServerLoop,
    server: grpc.aio.Server,
    health_servicer: health_aio.HealthServicer,
    target: str,
    metrics_port: int | None,
    joined: JoinedProcesses | None,
) -> Server:
    """Start the bound server on its loop, and what works beside it."""
    retention = None if plane.joined else _retention(plane)
    anchors = None if plane.joined else _anchors(plane)
    plane.store.commit_on(loop.loop)
    loop.run(server.start())
    if plane.config.server.watch_policies:
        plane.reloader.start()
    sweeper = None
    if not plane.joined:
        sweeper = Sweeper(plane, plane.config.server.approval_sweep_seconds)
        sweeper.start()
    shared = plane.config.process_count > 1 or plane.config.store_url is not None
    tail = ApprovalTail(plane.store, plane.approval_events) if shared else None
    if tail is not None:
        tail.start()
    host, _, port = target.rpartition(":")
    return Server(
        plane=plane,
        grpc_server=server,
        loop=loop,
        port=int(port),
        host=host,
        health=health_servicer,
        sweeper=sweeper,
        metrics_port=metrics_port,
        retention=retention,
        approval_tail=tail,
        joined=joined,
        anchors=anchors,
        notifier=None if plane.joined else start_notifier(plane),
        reporter=None if plane.joined else _report_replica(plane),
    )


def _listening(
    plane: Plane,
    processes: int,
    listen: str,
    before_listening: Callable[[], None] | None = None,
) -> tuple[ServerLoop, grpc.aio.Server, health_aio.HealthServicer, int]:
    """The server loop, and the server bound to ``listen`` on it, not yet
    started; ``before_listening`` runs between making the server and binding.

    Raises:
        OSError: the address cannot be bound (the plane is closed).
    """
    loop = ServerLoop()
    try:
        server, health_servicer = loop.run(_grpc_server(plane, processes))
        if before_listening is not None:
            before_listening()
        port = loop.run(_bind(server, plane.config, listen))
    except BaseException:
        plane.close()
        loop.close()
        raise
    return loop, server, health_servicer, port


async def _grpc_server(
    plane: Plane, processes: int
) -> tuple[grpc.aio.Server, health_aio.HealthServicer]:
    """The gRPC server with every servicer, health and reflection, not yet
    bound; made on the loop it will serve from."""
    config = plane.config
    receive = config.server.max_input_bytes + 1_048_576
    # An answer may be larger than any request: Register echoes what it was
    # sent, with what the plane adds to each capability; discovery answers
    # with up to a service's whole registry.
    send = max(receive, config.limits.max_registry_bytes_per_service) + 1_048_576
    server = grpc.aio.server(
        migration_thread_pool=futures.ThreadPoolExecutor(
            max_workers=plane.config.server.workers, thread_name_prefix="warden-rpc"
        ),
        interceptors=[TelemetryInterceptor(plane.telemetry)],
        options=[
            ("grpc.max_receive_message_length", receive),
            ("grpc.max_send_message_length", send),
            # Only the processes of one plane share a port (``_claim``).
            ("grpc.so_reuseport", int(processes > 1)),
        ],
    )
    # The generated functions call only the two methods it has.
    generic = cast(grpc.aio.Server, _GenericOnly(server))
    governor_pb2_grpc.add_GovernorServicer_to_server(GovernorServicer(plane), generic)
    registry_pb2_grpc.add_RegistryServicer_to_server(RegistryServicer(plane), generic)
    policy_pb2_grpc.add_PoliciesServicer_to_server(PoliciesServicer(plane), generic)
    approvals_pb2_grpc.add_ApprovalsServicer_to_server(ApprovalsServicer(plane), generic)
    grants_pb2_grpc.add_GrantKeysServicer_to_server(GrantKeysServicer(plane), generic)
    audit_pb2_grpc.add_AuditServicer_to_server(AuditServicer(plane), generic)
    health_servicer = health_aio.HealthServicer()  # answered on the loop
    # Known, and not serving, until ``serve`` says otherwise: a health check
    # that reaches this process first (its port is shared) is told to wait,
    # not that the service does not exist.
    await _health_of_all(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, generic)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    return server, health_servicer


class _GenericOnly:
    """The server as the generated ``add_*Servicer_to_server`` functions see
    it: each service's methods served through its one generic handler, none
    registered one by one. grpc.aio keeps a pending future per registered
    method and waits on all of them (``asyncio.wait``) at every wake-up that
    accepts calls, about two dozen here; generic handlers share one. That
    wait cost 2 to 3% of a ``Begin``'s CPU (``docs/performance.md``, item 46).
    Reflection is registered on the server itself, which it checks is a
    grpc.aio one."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(
        self, handlers: Sequence[grpc.GenericRpcHandler[Any, Any]]
    ) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: object) -> None:
        """Left out: the same methods came in the service's generic handler."""


async def _health_of_all(
    health_servicer: health_aio.HealthServicer, status: health_pb2.HealthCheckResponse.ServingStatus
) -> None:
    """Set every service's health, and the server's as a whole (``""``), at once."""
    for name in (*SERVICE_NAMES, ""):
        await health_servicer.set(name, status)


async def _bind(server: grpc.aio.Server, config: Config, listen: str) -> int:
    """Bind ``listen`` (with TLS when configured); returns the port.

    Raises:
        OSError: the certificates cannot be read or the address bound.
    """
    try:
        credentials = server_credentials(config)
    except OSError as exc:
        raise OSError(f"cannot serve TLS: {exc}") from None
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {listen}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen on {listen}: the address is in use or not available")
    return port


def _hold(listen: str) -> tuple[list[socket.socket], str]:
    """Bind ``listen``'s addresses without listening, as the plane's processes
    will (SO_REUSEPORT), choosing the port when it is 0: the sockets, and the
    address with its port. A connection to a port bound but not listening is
    refused, not queued for a process.

    Raises:
        OSError: the address is in use or not available.
    """
    host, _, port = listen.rpartition(":")
    held: list[socket.socket] = []
    try:
        for family, kind, proto, address in addresses(listen):
            held_socket = socket.socket(family, kind, proto)
            held.append(held_socket)
            held_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            held_socket.bind((address[0], int(port), *address[2:]))
            port = str(held_socket.getsockname()[1])  # the one chosen, for every address
    except OSError:
        for held_socket in held:
            held_socket.close()
        raise OSError(
            f"cannot listen on {listen}: the address is in use or not available"
        ) from None
    return held, f"{host}:{port}"


def _retention(plane: Plane) -> RetentionScheduler | None:
    """Start pruning on a schedule when ``[audit] retention`` is set."""
    audit = plane.config.audit
    if not audit.retention:
        return None
    # load_checkpoint_key insists on a private key when retention is set.
    assert isinstance(plane.checkpoints, CheckpointSigner)
    scheduler = RetentionScheduler(
        plane.store,
        plane.checkpoints,
        retention=audit.retention,
        interval=parse_duration(audit.prune_interval),
    )
    scheduler.start()
    return scheduler


def _report_replica(plane: Plane) -> ReplicaReporter:
    """Report what this replica serves, and show every live replica in ``/metrics``."""
    interval = plane.config.server.replica_report_seconds
    plane.telemetry.metrics.registry.register(
        ReplicaMetrics(lambda: live_replicas(plane.store, interval, plane.clock()))
    )
    reporter = ReplicaReporter(plane)
    reporter.start()
    return reporter


def _anchors(plane: Plane) -> AnchorPublisher | None:
    """Start publishing the chain's head when ``[audit] anchor_interval`` is set."""
    interval = plane.config.audit.anchor_interval
    if not interval:
        return None
    signer = plane.checkpoints if isinstance(plane.checkpoints, CheckpointSigner) else None
    publisher = AnchorPublisher(
        plane.store, plane.config.anchors_path, interval=parse_duration(interval), signer=signer
    )
    publisher.start()
    return publisher
