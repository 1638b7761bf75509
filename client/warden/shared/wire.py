"""Names on the wire that are not messages."""

from typing import Final

SERVICE_TOKEN_METADATA: Final = "x-warden-service-token"  # noqa: S105 (a header name)
"""The gRPC metadata key that carries the calling service's token."""
