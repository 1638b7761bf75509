"""Service authentication and namespace ownership (SI-7)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from warden.shared.wire import SERVICE_TOKEN_METADATA
from warden_server.config import Config

__all__ = [
    "SERVICE_TOKEN_METADATA",
    "Service",
    "ServiceAuthenticationError",
    "ServiceAuthenticator",
]


class ServiceAuthenticationError(Exception):
    """No service token, or one that matches no configured service."""


@dataclass(frozen=True, slots=True)
class Service:
    """A calling service and the capability namespaces it owns."""

    name: str
    namespaces: tuple[str, ...]

    def owns(self, capability_id: str) -> bool:
        return any(
            capability_id == ns or capability_id.startswith(ns + ".") for ns in self.namespaces
        )


class ServiceAuthenticator:
    """Maps a presented token to its service, comparing digests in constant time."""

    def __init__(self, services: Mapping[str, tuple[str, Service]]) -> None:
        self._by_digest = {digest: service for digest, service in services.values()}

    @classmethod
    def from_config(cls, config: Config) -> ServiceAuthenticator:
        return cls(
            {
                name: (section.token_digest, Service(name, tuple(section.namespaces)))
                for name, section in config.services.items()
            }
        )

    def authenticate(self, token: str | None) -> Service:
        if not token:
            raise ServiceAuthenticationError(
                f"missing service token (metadata {SERVICE_TOKEN_METADATA!r})"
            )
        presented = hashlib.sha256(token.encode()).hexdigest()
        found = None
        for digest, service in self._by_digest.items():
            if hmac.compare_digest(digest, presented):
                found = service
        if found is None:
            raise ServiceAuthenticationError("unknown service token")
        return found
