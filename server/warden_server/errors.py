"""The plane's request errors. Servicers map them to gRPC status in one place
(``services/status.py``); the message is written for the calling developer."""

from __future__ import annotations


class RequestError(Exception):
    """A request the plane refuses; subclasses say which kind."""


class InvalidRequest(RequestError):
    """Missing or malformed fields."""


class Unauthenticated(RequestError):
    """No valid service credential."""


class PermissionDenied(RequestError):
    """The service may not do this (e.g. a namespace it does not own, SI-7)."""


class NotFound(RequestError):
    """No such object (or one the caller may not see)."""


class Conflict(RequestError):
    """The request contradicts what the store already holds."""


class FailedPrecondition(RequestError):
    """The request is well formed but the plane's state forbids it (e.g. a
    capability version that would break a policy rule in force)."""


class ResourceExhausted(RequestError):
    """The plane is at one of its limits; the message names it."""


class RateLimited(ResourceExhausted):
    """The caller is over a rate limit; ``retry_after_ms`` says when to try again."""

    def __init__(self, message: str, *, retry_after_ms: int) -> None:
        super().__init__(f"{message}; retry in {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms
