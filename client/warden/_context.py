"""What a handler receives beside its input."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from warden._errors import CapabilityError


@dataclass(frozen=True, slots=True)
class DeclaredError:
    """An error a capability declares: part of its contract, shown to models."""

    code: str
    message: str
    retryable: bool = False


@dataclass(frozen=True, slots=True)
class Actor:
    """The verified actor a call is made for (from its JWT, checked by the plane)."""

    id: str
    roles: tuple[str, ...] = ()
    tenant: str = ""
    attrs: Mapping[str, Any] = field(default_factory=dict)


class DeclaredErrors:
    """``ctx.errors.NOT_ELIGIBLE(details=...)`` builds a capability's declared error."""

    def __init__(self, declared: Mapping[str, DeclaredError]) -> None:
        self._declared = dict(declared)

    def __getattr__(self, code: str) -> _ErrorFactory:
        try:
            return _ErrorFactory(self._declared[code])
        except KeyError:
            known = ", ".join(sorted(self._declared)) or "none"
            raise AttributeError(
                f"{code} is not a declared error of this capability (declared: {known})"
            ) from None

    def __contains__(self, code: object) -> bool:
        return code in self._declared


@dataclass(frozen=True, slots=True)
class _ErrorFactory:
    declared: DeclaredError

    def __call__(self, *, details: dict[str, Any] | None = None) -> CapabilityError:
        return CapabilityError(
            self.declared.code,
            self.declared.message,
            stage="execution",
            retryable=self.declared.retryable,
            expose_to_model=True,
            details=details,
        )


@dataclass(frozen=True, slots=True)
class Context:
    """Handed to every handler.

    Attributes:
        actor: Who the call is made for.
        invocation_id: This attempt's id (it is in the audit log).
        errors: The capability's declared errors: ``raise ctx.errors.NOT_ELIGIBLE()``.
        grant_token: The plane's signed grant for this invocation; pass it to a
            downstream service, which checks it with ``warden.verify_grant``.
        capability_id: The capability being run.
    """

    actor: Actor
    invocation_id: str
    errors: DeclaredErrors
    grant_token: str = ""
    capability_id: str = ""


Authorizer = Callable[[Any, Context], "bool | Awaitable[bool]"]
"""App middleware for pipeline step 6: given the validated input and the
``Context``, True lets the handler run; False refuses with FORBIDDEN."""
