"""Names on the wire that are not messages."""

from typing import Final

SERVICE_TOKEN_METADATA: Final = "x-warden-service-token"  # noqa: S105 (a header name)
"""The gRPC metadata key that carries the calling service's token."""

ACTOR_TOKEN_METADATA: Final = "authorization"  # noqa: S105 (a header name)
"""The gRPC metadata key that carries an actor's own JWT as ``Bearer <JWT>``, where
the actor calls the plane in person (approvers, auditors)."""
BEARER: Final = "Bearer"

PROCESS_METADATA: Final = "x-warden-process"
"""The trailing gRPC metadata key by which the plane's process that answered a
``Governor`` call names itself (a random id per process): the SDK balances its
calls between processes, not only between its connections."""

MAX_IDEMPOTENCY_KEY: Final = 255
"""The longest idempotency key a ``Begin`` may carry, in characters: the plane
refuses a longer one (``INVALID_ARGUMENT``), and the SDKs before sending it."""
