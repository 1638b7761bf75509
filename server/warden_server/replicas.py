"""What each replica of the plane serves, for every replica to show.

A replica is the processes of one ``warden serve``; replicas share a store
(PostgreSQL), and a plane on SQLite is one replica. Each one's first process
keeps a row in the store's ``replicas`` table: its policy revision in force and
since when, the change of its folder it refused (while that stands), how many
capability versions it has read from the registry, and whether it leads (runs
approval expiry, retention and anchors for the cluster). It reports at start,
whenever its policy set changes or a change is refused, and every
``[server] replica_report_seconds``; a replica not heard from for
``MISSED_REPORTS`` periods is no longer live. ``Policies.GetStatus`` and
``/metrics`` show the live ones, so an operator sees a replica that lags or
refuses a policy set.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from warden_server.store import Store
from warden_server.store.records import ReplicaRecord

if TYPE_CHECKING:
    from prometheus_client import Metric

    from warden_server.plane import Plane

log = logging.getLogger(__name__)

MISSED_REPORTS = 3
"""Reports a replica may miss before it no longer counts as live."""
FORGOTTEN_AFTER = timedelta(days=1)
"""How long the row of a replica that vanished (killed, not stopped) stays."""


def new_replica_id() -> str:
    """A name for this run of the plane: the host and a random suffix."""
    return f"{socket.gethostname()}/{uuid.uuid4().hex[:8]}"


def live_replicas(store: Store, interval: float, now: datetime) -> list[ReplicaRecord]:
    """The replicas that reported within ``MISSED_REPORTS`` periods of ``now``."""
    return store.replicas((now - timedelta(seconds=interval * MISSED_REPORTS)).isoformat())


class ReplicaReporter:
    """Keeps this replica's row current, on a thread, until ``stop``."""

    def __init__(self, plane: Plane) -> None:
        self._plane = plane
        self._interval = plane.config.server.replica_report_seconds
        self._started_at = plane.clock().isoformat()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warden-replica", daemon=True)

    def start(self) -> None:
        try:
            self.report()
        except Exception as exc:
            log.warning("could not report this replica (%s); retrying", exc)
        self._thread.start()

    def stop(self) -> None:
        """Stop reporting and remove this replica's row."""
        self._stop.set()
        self._plane.policies.changed.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        replica_id = self._plane.replica_id
        try:
            self._plane.store.transact(lambda tx: tx.forget_replica(replica_id))
        except Exception:
            log.warning("could not remove this replica's row; it ages out")

    def report(self) -> None:
        """Write this replica's row now."""
        plane = self._plane
        status = plane.policies.status()
        rejected = status.rejected
        now = plane.clock()
        record = ReplicaRecord(
            replica_id=plane.replica_id,
            host=socket.gethostname(),
            processes=plane.config.process_count,
            revision=status.current.revision,
            loaded_at=status.loaded_at.isoformat(),
            refused_revision=rejected.revision if rejected else None,
            refused_at=rejected.at.isoformat() if rejected else None,
            registrations=plane.registry.versions_read(),
            leader=plane.store.leads(),
            started_at=self._started_at,
            seen_at=now.isoformat(),
        )
        forget_before = (now - FORGOTTEN_AFTER).isoformat()
        plane.store.transact(lambda tx: tx.report_replica(record, forget_before=forget_before))

    def _run(self) -> None:
        changed = self._plane.policies.changed
        while not self._stop.is_set():
            changed.wait(self._interval)
            changed.clear()
            if self._stop.is_set():
                return
            try:
                self.report()
            except Exception as exc:
                log.warning("could not report this replica (%s); retrying", exc)


class ReplicaMetrics(Collector):
    """``/metrics`` series of every live replica, read from the store at each scrape.

    Labels stay bounded: one series per live replica (and per metric).
    """

    def __init__(self, replicas: Callable[[], Iterable[ReplicaRecord]]) -> None:
        self._replicas = replicas

    def collect(self) -> Iterable[Metric]:
        try:
            replicas = list(self._replicas())
        except Exception as exc:
            log.warning("cannot read the replicas for /metrics (%s)", exc)
            return
        info = InfoMetricFamily(
            "warden_replica_policy",
            "The policy revision each live replica serves, and the change it refused, if any.",
            labels=["replica", "host"],
        )
        loaded = GaugeMetricFamily(
            "warden_replica_policy_loaded_timestamp_seconds",
            "When each live replica put its policy revision in force.",
            labels=["replica"],
        )
        registrations = GaugeMetricFamily(
            "warden_replica_registrations",
            "Capability versions each live replica has read from the registry.",
            labels=["replica"],
        )
        leader = GaugeMetricFamily(
            "warden_replica_leader",
            "1 for the replica that runs approval expiry, retention and anchors.",
            labels=["replica"],
        )
        for r in replicas:
            info.add_metric(
                [r.replica_id, r.host],
                {"revision": r.revision, "refused_revision": r.refused_revision or ""},
            )
            loaded.add_metric([r.replica_id], datetime.fromisoformat(r.loaded_at).timestamp())
            registrations.add_metric([r.replica_id], r.registrations)
            leader.add_metric([r.replica_id], int(r.leader))
        yield from (info, loaded, registrations, leader)
