"""Names on the wire that are not messages."""

from typing import Final

SERVICE_TOKEN_METADATA: Final = "x-warden-service-token"  # noqa: S105 (a header name)
"""The gRPC metadata key that carries the calling service's token."""

ACTOR_TOKEN_METADATA: Final = "authorization"  # noqa: S105 (a header name)
"""The gRPC metadata key that carries an actor's JWT as ``Bearer <jwt>``, where
the actor calls the plane in person (an auditor on the audit API)."""
