"""The plane: everything a request needs, wired once at start."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from warden.shared.redaction import Redaction
from warden_server.auth.actors import ActorVerifier
from warden_server.auth.services import ServiceAuthenticator
from warden_server.config import Config
from warden_server.grants import GrantSigner
from warden_server.policy.engine import PolicySet
from warden_server.policy.loader import load_policies
from warden_server.registry import Registry
from warden_server.sealing import Sealer
from warden_server.store import SQLiteStore, Store

log = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(UTC)


class PolicyHolder:
    """The current policy set; replaced whole, never edited (SI-12)."""

    def __init__(self, policies: PolicySet) -> None:
        self._current = policies
        self._lock = threading.Lock()

    def current(self) -> PolicySet:
        return self._current

    def swap(self, policies: PolicySet) -> PolicySet:
        with self._lock:
            previous, self._current = self._current, policies
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
    redaction: Redaction = field(default_factory=Redaction)
    """How sensitive values are stored (SI-5)."""
    sealer: Sealer = field(default_factory=lambda: Sealer.from_secret(None))
    """Seals outputs recorded for idempotent replay."""

    @classmethod
    def from_config(cls, config: Config, *, clock: Callable[[], datetime] = utc_now) -> Plane:
        """Open the store, load the policies and keys the config names.

        Raises:
            PolicyLoadError: the policy folder has problems.
            ValueError, OSError: unreadable keys or store.
        """
        policies = load_policies(config.policies_path, default_effect=config.server.default_effect)
        key_file = config.grants.signing_key_file
        grants = GrantSigner.from_files(
            config.path(key_file) if key_file else None,
            [config.path(f) for f in config.grants.verification_key_files],
        )
        hash_key = config.redaction.hash_key if config.redaction.mode == "keyed-hash" else None
        if config.idempotency.replay_key is None:
            log.warning(
                "idempotency.replay_key is not set: outputs recorded for replay "
                "cannot be replayed after a restart"
            )
        actors = ActorVerifier.from_config(config)
        store = SQLiteStore(config.store_path)
        return cls(
            config=config,
            store=store,
            registry=Registry(store),
            policies=PolicyHolder(policies),
            actors=actors,
            services=ServiceAuthenticator.from_config(config),
            grants=grants,
            clock=clock,
            redaction=Redaction(hash_key.encode() if hash_key else None),
            sealer=Sealer.from_secret(config.idempotency.replay_key),
        )

    def close(self) -> None:
        self.store.close()
