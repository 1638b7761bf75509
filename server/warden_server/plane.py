"""The plane: everything a request needs, wired once at start."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from warden_server.audit.checkpoint import CheckpointKeyError, CheckpointSigner, CheckpointVerifier
from warden_server.auth.actors import ActorVerifier
from warden_server.auth.services import ServiceAuthenticator
from warden_server.config import Config
from warden_server.grants import GrantSigner
from warden_server.policy.engine import PolicySet
from warden_server.policy.loader import load_policies
from warden_server.registry import Registry
from warden_server.store import SQLiteStore, Store
from warden_server.telemetry import Telemetry


def utc_now() -> datetime:
    return datetime.now(UTC)


class PolicyHolder:
    """The current policy set; replaced whole, never edited (SI-12)."""

    def __init__(
        self, policies: PolicySet, on_swap: Callable[[str, str | None], None] | None = None
    ) -> None:
        self._current = policies
        self._lock = threading.Lock()
        self._on_swap = on_swap
        if on_swap is not None:
            on_swap(policies.revision, None)

    def current(self) -> PolicySet:
        return self._current

    def swap(self, policies: PolicySet) -> PolicySet:
        with self._lock:
            previous, self._current = self._current, policies
        if self._on_swap is not None:
            self._on_swap(policies.revision, previous.revision)
        return previous


@dataclass
class Plane:
    config: Config
    store: Store
    registry: Registry
    policies: PolicyHolder
    actors: ActorVerifier
    services: ServiceAuthenticator
    grants: GrantSigner
    clock: Callable[[], datetime] = utc_now
    telemetry: Telemetry = field(default_factory=Telemetry)
    checkpoints: CheckpointVerifier | None = None
    """Checks retention checkpoints; a ``CheckpointSigner`` where this plane prunes."""

    @classmethod
    def from_config(cls, config: Config, *, clock: Callable[[], datetime] = utc_now) -> Plane:
        """Open the store, load the policies and keys the config names.

        Raises:
            PolicyLoadError: the policy folder has problems.
            ValueError, OSError: unreadable keys or store (a CheckpointKeyError is a
                ValueError).
        """
        policies = load_policies(config.policies_path, default_effect=config.server.default_effect)
        key_file = config.grants.signing_key_file
        grants = GrantSigner.from_file(config.path(key_file) if key_file else None)
        actors = ActorVerifier.from_config(config)
        checkpoints = load_checkpoint_key(config)
        telemetry = Telemetry.from_config(config.telemetry)
        store = SQLiteStore(config.store_path, observer=telemetry)
        return cls(
            config=config,
            store=store,
            registry=Registry(store),
            policies=PolicyHolder(policies, on_swap=telemetry.policy_swapped),
            actors=actors,
            services=ServiceAuthenticator.from_config(config),
            grants=grants,
            clock=clock,
            telemetry=telemetry,
            checkpoints=checkpoints,
        )

    def close(self) -> None:
        self.store.close()
        self.telemetry.close()


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
