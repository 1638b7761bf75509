"""The plane: everything a request needs, wired once at start."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from warden.shared.redaction import Redaction
from warden_server.approvals.events import ApprovalHub
from warden_server.audit.access import AuditReads, ReadLimiter
from warden_server.audit.checkpoint import CheckpointKeyError, CheckpointSigner, CheckpointVerifier
from warden_server.auth.actors import ActorVerifier
from warden_server.auth.services import ServiceAuthenticator
from warden_server.config import Config
from warden_server.grants import GrantSigner, default_key_path
from warden_server.limits import epoch, usage_gauges
from warden_server.policy.engine import PolicySet
from warden_server.policy.loader import Problem
from warden_server.registry import Registry
from warden_server.reload import PolicyReloader, load_at_start
from warden_server.replicas import new_replica_id
from warden_server.sealing import Sealer
from warden_server.store import Store, open_store
from warden_server.telemetry import Telemetry

log = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Rejection:
    """A change to the policy folder that was refused."""

    revision: str
    """The content hash of the refused files (empty when the folder was unreadable)."""
    files: tuple[str, ...]
    at: datetime
    problems: tuple[Problem, ...]


@dataclass(frozen=True, slots=True)
class PolicyStatus:
    """The set in force, since when, and the newest refused change, if any."""

    current: PolicySet
    loaded_at: datetime
    rejected: Rejection | None = None


class PolicyHolder:
    """The current policy set; replaced whole, never edited (SI-12).

    Everything is one immutable ``PolicyStatus`` behind one reference, so a
    reader sees the old set or the new one, never a mix.
    """

    def __init__(self, policies: PolicySet, loaded_at: datetime | None = None) -> None:
        self._status = PolicyStatus(policies, loaded_at or utc_now())
        self._lock = threading.Lock()
        self.changed = threading.Event()
        """Set at every change of the status (what this replica reports)."""

    def current(self) -> PolicySet:
        return self._status.current

    def status(self) -> PolicyStatus:
        return self._status

    def swap(self, policies: PolicySet, at: datetime | None = None) -> PolicySet:
        """Put ``policies`` in force; any pending rejection is settled by it."""
        with self._lock:
            previous = self._status.current
            self._status = PolicyStatus(policies, at or utc_now())
        self.changed.set()
        return previous

    def reject(
        self, revision: str, files: Sequence[str], problems: Sequence[Problem], at: datetime
    ) -> None:
        """Record the newest refused change; the set in force stays."""
        rejection = Rejection(revision, tuple(files), at, tuple(problems))
        with self._lock:
            self._status = replace(self._status, rejected=rejection)
        self.changed.set()

    def settle(self) -> None:
        """The folder is back to the set in force: no change is pending."""
        with self._lock:
            self._status = replace(self._status, rejected=None)
        self.changed.set()


@dataclass(frozen=True, slots=True)
class ProcessSecrets:
    """What the processes of one plane must share beyond their config: the keys
    the first one read or made at start (the grant key, a fresh sealing key), so
    a grant signed by one process is accepted by another."""

    grant_key_pem: str
    seal_key_hex: str
    replica_id: str = ""
    """The name the processes report under together (``replicas.py``)."""

    @classmethod
    def from_config(cls, config: Config) -> ProcessSecrets:
        """Read the keys the config names, or those kept beside the store
        (made there on the first start), and name the replica.

        Raises:
            ValueError, OSError: a key file cannot be read, used or made (the
                message names it).
        """
        replay_key = config.idempotency.replay_key
        sealer = (
            Sealer.from_secret(replay_key)
            if replay_key is not None
            else Sealer.beside(config.store_path)
        )
        key_file = config.grants.signing_key_file
        grants = GrantSigner.from_files(
            config.path(key_file) if key_file else default_key_path(config.store_path),
            create=key_file is None,
        )
        return cls(grants.private_pem().decode(), sealer.key.hex(), new_replica_id())


@dataclass
class Plane:
    config: Config
    store: Store
    registry: Registry
    policies: PolicyHolder
    reloader: PolicyReloader
    actors: ActorVerifier
    services: ServiceAuthenticator
    grants: GrantSigner
    audit_reads: AuditReads
    """Rate-limits and records audit API reads (SI-13)."""
    clock: Callable[[], datetime] = utc_now
    redaction: Redaction = field(default_factory=Redaction)
    """How sensitive values are stored (SI-5)."""
    sealer: Sealer = field(default_factory=lambda: Sealer.from_secret(None))
    """Seals outputs recorded for idempotent replay."""
    approval_events: ApprovalHub = field(default_factory=ApprovalHub)
    telemetry: Telemetry = field(default_factory=Telemetry)
    checkpoints: CheckpointVerifier | None = None
    """Checks retention checkpoints; a ``CheckpointSigner`` where this plane prunes."""
    replica_id: str = field(default_factory=new_replica_id)
    """This replica's name in the store's ``replicas`` table."""
    process_id: str = field(default_factory=lambda: os.urandom(6).hex())
    """Names this process to the SDKs (``x-warden-process``), which balance
    their calls between the processes of a plane."""
    joined: bool = False
    """This process joined a plane another process started (``[server] processes``):
    that one alone sweeps approvals and prunes, and serves the plane's metrics."""
    closing: set[asyncio.Task[None]] = field(default_factory=set)
    """Grants being closed on the server's loop because their ``Begin`` ended
    before it answered; the server waits for them before the store closes."""

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        clock: Callable[[], datetime] = utc_now,
        joined: bool = False,
        secrets: ProcessSecrets | None = None,
    ) -> Plane:
        """Open the store, load the policies and keys the config names.

        The policy folder is checked against the registered capabilities and
        its loading recorded in the audit log; watching it starts with
        ``reloader.start()``. The keys are ``secrets`` when given (those every
        process of the plane shares), else read or made here.

        Raises:
            PolicyLoadError: the policy folder has problems.
            ValueError, OSError: unreadable keys or store (a CheckpointKeyError is a
                ValueError).
        """
        if secrets is None:
            secrets = ProcessSecrets.from_config(config)
        verification = [config.path(f) for f in config.grants.verification_key_files]
        grants = GrantSigner.from_pem(secrets.grant_key_pem.encode(), verification)
        sealer = Sealer(bytes.fromhex(secrets.seal_key_hex))
        hash_key = config.redaction.hash_key if config.redaction.mode == "keyed-hash" else None
        actors = ActorVerifier.from_config(config)
        checkpoints = load_checkpoint_key(config)
        telemetry = Telemetry.from_config(config.telemetry)
        # The store reports what it commits, so the metrics agree with the
        # log, the loading of the policy set at start included.
        store = open_store(config.store_url, config.store_path, observer=telemetry)
        # Other processes, or other replicas, write to the same store.
        shared = config.process_count > 1 or config.store_url is not None
        try:
            if config.store_url is not None:  # replicas, perhaps on other hosts
                _agree_on_keys(config, store, grants, sealer)
            registry = Registry(store, config.limits)
            telemetry.metrics.declared_codes = registry.declared_codes
            policies = PolicyHolder(load_at_start(config, store, registry, joining=joined))
            telemetry.metrics.limit_usage = lambda: usage_gauges(
                policies.current(), store, epoch(clock())
            )
            telemetry.metrics.policy_revision = lambda: policies.current().revision
        except BaseException:
            store.close()
            telemetry.close()
            raise
        return cls(
            config=config,
            store=store,
            registry=registry,
            policies=policies,
            reloader=PolicyReloader(config, store, registry, policies, shared=shared),
            actors=actors,
            services=ServiceAuthenticator.from_config(config),
            grants=grants,
            clock=clock,
            redaction=Redaction(hash_key.encode() if hash_key else None),
            sealer=sealer,
            approval_events=ApprovalHub(
                max_watchers=config.server.max_approval_watchers,
                shared=shared,
                last_seq=store.last_seq,
            ),
            telemetry=telemetry,
            checkpoints=checkpoints,
            audit_reads=AuditReads(
                store, ReadLimiter(config.audit.read_rate, config.audit.read_burst)
            ),
            joined=joined,
            replica_id=secrets.replica_id or new_replica_id(),
        )

    def secrets(self) -> ProcessSecrets:
        """The keys a process joining this plane must use, and the replica's name."""
        return ProcessSecrets(
            self.grants.private_pem().decode(), self.sealer.key.hex(), self.replica_id
        )

    def close(self) -> None:
        self.reloader.stop()
        self.approval_events.close()
        self.audit_reads.close()
        self.store.close()
        self.telemetry.close()


def _agree_on_keys(config: Config, store: Store, grants: GrantSigner, sealer: Sealer) -> None:
    """Refuse to serve a PostgreSQL store with a grant key or replay key the
    other replicas on it do not share (``PostgresStore.agree_on_keys``).

    Raises:
        StoreError: a key differs.
    """
    from warden_server.store.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    key_file = config.grants.signing_key_file
    store.agree_on_keys(
        signing=grants.key_id,
        published=[key.key_id for key in grants.published()],
        replay_check=sealer.fingerprint(),
        where=str(config.path(key_file) if key_file else default_key_path(config.store_path)),
    )


def load_checkpoint_key(config: Config) -> CheckpointVerifier | None:
    """The configured checkpoint key: a signer for a private key, a verifier for a
    public one, None when unset.

    Raises:
        CheckpointKeyError: unreadable or not Ed25519.
    """
    key_file = config.audit.checkpoint_key_file
    if not key_file:
        return None
    path = config.path(key_file)
    verifier = CheckpointVerifier.from_file(path)
    try:
        return CheckpointSigner.from_private_file(path)
    except CheckpointKeyError:
        if config.audit.retention:
            raise
        return verifier
