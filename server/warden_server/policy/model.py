"""The policy file format (SPEC §6), as pydantic models.

These models are the single definition of the format: the loader validates
against them and the JSON Schema editors use is generated from them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Effect = Literal["allow", "deny", "require_approval", "hide"]
EFFECT_PRECEDENCE: tuple[Effect, ...] = ("hide", "deny", "require_approval", "allow")
"""Strongest first: hide beats deny beats require_approval beats allow."""

_DURATION = re.compile(r"^(\d+)(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
GLOB = r"^[a-z0-9_*?]+(\.[a-z0-9_*?]+)*$"


def parse_duration(text: str) -> int:
    """Seconds in a duration such as ``90s``, ``30m``, ``1h`` or ``7d``."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration like 90s, 30m, 1h or 7d")
    return int(match.group(1)) * _UNITS[match.group(2)]


class Rule(BaseModel):
    """One rule: for the capabilities its globs match, when ``when`` holds, ``effect``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=128)]
    """Unique across the policy set; decisions and audit records name it."""
    capabilities: Annotated[list[Annotated[str, Field(pattern=GLOB)]], Field(min_length=1)]
    """Glob patterns over capability ids, e.g. ``orders.*``."""
    effect: Effect
    """allow, deny, require_approval or hide."""
    when: str = "true"
    """A CEL condition over actor, capability, input, context and now."""
    message: str | None = None
    """The public message, written as an instruction to the model."""
    message_expr: str | None = None
    """A CEL expression producing the message; falls back to ``message`` on error."""
    approvers: str | None = None
    """require_approval only: a CEL condition over approver, requester, capability, input."""
    ttl: str | None = None
    """require_approval only: how long the approval request stays open (e.g. 1h)."""
    mode: Literal["enforce", "audit"] = "enforce"
    """audit: evaluated and recorded ("would have denied") but not enforced."""
    description: str | None = None
    """For people reading the policy; never shown to models."""

    @field_validator("ttl")
    @classmethod
    def _ttl_is_duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)
        return value


class PolicyFile(BaseModel):
    """A policy file: a list of rules."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: list[Rule] = []


class TestActor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = "test-actor"
    roles: list[str] = []
    tenant: str = ""
    attrs: dict[str, Any] = {}


class TestCapability(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    version: str = "1"
    service: str = ""
    side_effect: Literal["read", "write", "idempotent"] = "write"
    tags: list[str] = []


class Expectation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    effect: Literal["allow", "deny", "require_approval", "hide", "error"]
    """The decision; ``error`` means a policy failed (POLICY_FAILED)."""
    rule: str | None = None
    """The deciding rule's id."""
    message: str | None = None
    """The public message."""


class PolicyTest(BaseModel):
    """One policy test case (SPEC §6)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    capability: str | TestCapability
    actor: TestActor = TestActor()
    input: dict[str, Any] = {}
    context: dict[str, Any] = {}
    now: str | None = None
    """An RFC 3339 timestamp; the test run's start when absent."""
    expect: Expectation


class PolicyTestFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tests: list[PolicyTest]
