"""The state of one Begin request as it moves through the stages."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from warden_server.auth.actors import Actor
from warden_server.auth.services import Service
from warden_server.policy.cel import Activation
from warden_server.policy.engine import Decision, PolicySet
from warden_server.policy.variables import decision_variables
from warden_server.registry import Capability
from warden_server.store import ApprovalRecord


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
    """The policy variables, converted once per decision (input added at step 7)."""
    visibility: Decision | None = None
    decision: Decision | None = None
    approval_id: str | None = None
    approval: ApprovalRecord | None = None
    """The approval the call presented, once it is known to be bound to the call."""
    consume_approval: bool = False
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
