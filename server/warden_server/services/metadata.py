"""Credentials callers send in gRPC metadata, read in one place."""

from __future__ import annotations

import grpc

from warden.shared.wire import ACTOR_TOKEN_METADATA, BEARER
from warden_server.auth.actors import AuthenticationError


def actor_token(context: grpc.ServicerContext) -> str:
    """The JWT of ``authorization: Bearer <JWT>``, where an actor calls the
    plane in person (approvers, auditors); empty when absent.

    Raises:
        AuthenticationError: the metadata is present but not ``Bearer <JWT>``.
    """
    value = dict(context.invocation_metadata()).get(ACTOR_TOKEN_METADATA, "")
    if not isinstance(value, str) or not value:
        return ""
    scheme, _, token = value.partition(" ")
    if scheme.lower() != BEARER.lower() or not token.strip():
        raise AuthenticationError(f"the {ACTOR_TOKEN_METADATA} metadata must be 'Bearer <JWT>'")
    return token.strip()
