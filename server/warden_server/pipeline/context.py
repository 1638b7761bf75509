"""The state of one Begin request as it moves through the stages."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from warden_server.auth.actors import Actor
from warden_server.auth.services import Service
from warden_server.policy.cel import Activation
from warden_server.policy.engine import Decision, LimitsOutcome, PolicySet
from warden_server.policy.variables import decision_variables
from warden_server.registry import Capability
from warden_server.store import ApprovalRecord, IdempotencyRecord


@dataclass(frozen=True, slots=True)
class BeginRequest:
    """A decoded Begin request."""

    service: Service
    invocation_id: str
    capability_id: str
    capability_version: str
    actor_token: str
    input_json: str
    surface: str
    context: dict[str, Any]
    approval_id: str
    idempotency_key: str
    call_id: str | None = None
    """The logical call this attempt belongs to (automatic retries, SI-11)."""
    attempt: int | None = None
    timeout_ms: int = 0
    """The caller's time budget for the handler; zero means the capability's."""
    deadline: float = math.inf
    """When the plane stops working on this request (``time.monotonic()``)."""


@dataclass(slots=True)
class BeginContext:
    """What the stages have established so far."""

    request: BeginRequest
    policies: PolicySet
    now: datetime
    capability: Capability | None = None
    actor: Actor | None = None
    input: Any = None
    input_digest: str | None = None
    activation: Activation | None = None
    """The policy variables without ``input``, converted once per decision."""
    input_activation: Activation | None = None
    """The same with the validated ``input``, for the rules and the limits."""
    visibility: Decision | None = None
    decision: Decision | None = None
    limits: LimitsOutcome | None = None
    """What the call counts against each limit that matches it (step 7b)."""
    limited: list[dict[str, Any]] = field(default_factory=list)
    """The limits that refused the call or would have (audit mode), for the record."""
    approval_id: str | None = None
    approval: ApprovalRecord | None = None
    """The approval the call presented, once it is known to be bound to the call."""
    consume_approval: bool = False
    approval_superseded: bool = False
    """The rules no longer ask for the approval the call presented: it is
    consumed with the grant if it still can be, so that it cannot authorize
    the same call a second time once they ask again."""
    reservation: IdempotencyRecord | None = None
    """The idempotency key to reserve with the grant."""
    replay: IdempotencyRecord | None = None
    """A completed call with the same key and input: answer with its outcome."""
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def base_activation(self) -> Activation:
        """The policy variables without ``input``, converted on first use."""
        if self.activation is None:
            assert self.actor is not None and self.capability is not None
            self.activation = self.policies.activation(
                decision_variables(
                    actor=self.actor.to_cel(),
                    capability=self.capability.to_cel(),
                    context=self.request.context,
                    surface=self.request.surface,
                    now=self.now,
                )
            )
        return self.activation

    def with_input(self) -> Activation:
        """The policy variables with the validated input, typed as the
        checker typed it (``Capability.policy_input``), converted on first use."""
        if self.input_activation is None:
            assert self.capability is not None
            self.input_activation = self.policies.activation(
                {"input": self.capability.policy_input(self.input)}, self.base_activation()
            )
        return self.input_activation
