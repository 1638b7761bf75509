"""Names on the wire that are not messages."""

from typing import Final

SERVICE_TOKEN_METADATA: Final = "x-warden-service-token"  # noqa: S105 (a header name)
"""The gRPC metadata key that carries the calling service's token."""

ACTOR_TOKEN_METADATA: Final = "authorization"  # noqa: S105 (a header name)
"""The gRPC metadata key that carries an actor's own JWT as ``Bearer <JWT>``, where
the actor calls the plane in person (approvers, auditors)."""
BEARER: Final = "Bearer"
