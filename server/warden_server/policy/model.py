"""The policy file format (SPEC §6), as pydantic models.

These models are the single definition of the format: the loader validates
against them and the JSON Schema editors use is generated from them
(``warden policy schema``).
"""

from __future__ import annotations

import ast
import inspect
import re
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from warden_server.policy.globs import can_match_an_id

Effect = Literal["allow", "deny", "require_approval", "hide"]
EFFECT_PRECEDENCE: tuple[Effect, ...] = ("hide", "deny", "require_approval", "allow")
"""Strongest first: hide beats deny beats require_approval beats allow."""

_DURATION = re.compile(r"^(\d{1,15})(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
RULE_ID = r"^[a-z0-9][a-z0-9_.-]*$"
GLOB = r"^[a-z0-9_*?]+(\.[a-z0-9_*?]+)*$"
EXPRESSION_KEYS = ("when", "message_expr", "approvers")
"""The rule keys whose values are CEL expressions."""
LIMIT_EXPRESSION_KEYS = ("when", "key", "cost")
"""The limit keys whose values are CEL expressions."""
_PER = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d*)\s*(s|sec|second|m|min|minute|h|hour|d|day)s?\s*$"
)
PER = r"^\s*\d+(\.\d+)?\s*/\s*\d*\s*(s|sec|second|m|min|minute|h|hour|d|day)s?\s*$"
_PER_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60}
_PER_UNITS |= {"h": 3600, "hour": 3600, "d": 86400, "day": 86400}


def parse_duration(text: str, *, longest_days: int | None = None) -> int:
    """Seconds in a duration such as ``90s``, ``30m``, ``1h`` or ``7d``; with
    ``longest_days``, at most that many days."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration like 90s, 30m, 1h or 7d")
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if longest_days is not None and seconds > longest_days * 86_400:
        raise ValueError(f"{text!r} is longer than the longest duration, {longest_days}d")
    return seconds


MAX_TTL_DAYS: Final = 36_500
"""A hundred years: an approval request open longer is a mistake, and one
past the calendar's end cannot be added to a time at all."""


def parse_per(text: str, *, whole: bool) -> tuple[float, int]:
    """An amount per period, such as ``10/min``, ``5000/day`` or ``3/10s``:
    (amount, seconds). ``whole`` asks for a whole number of calls."""
    match = _PER.match(text)
    if not match:
        raise ValueError(f"{text!r} is not an amount per period like 10/min, 5000/day or 3/10s")
    amount = float(match.group(1))
    if whole and not amount.is_integer():
        raise ValueError(f"{text!r}: a rate counts whole calls")
    if amount <= 0:
        raise ValueError(f"{text!r}: the amount must be above zero")
    seconds = int(match.group(2) or 1) * _PER_UNITS[match.group(3)]
    if seconds <= 0:
        raise ValueError(f"{text!r}: the period must be above zero")
    return amount, seconds


def parse_timestamp(text: str) -> datetime:
    """An RFC 3339 timestamp; one without an offset is taken as UTC."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not an RFC 3339 timestamp like 2026-01-02T15:04:05Z"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _glob_can_match(glob: str) -> str:
    if not can_match_an_id(glob):
        raise ValueError(
            f"glob {glob!r} matches no valid capability id "
            "(ids are lowercase namespace.name, e.g. orders.refund)"
        )
    return glob


class _Strict(BaseModel):
    """The text under each field documents it: ``json_schema`` gives it as the
    field's description (``_field_docs``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Rule(_Strict):
    """One rule: for the capabilities its globs match, when ``when`` holds, ``effect``."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {"not": {"properties": {"effect": {"const": "require_approval"}}}},
                    "then": {
                        "not": {"anyOf": [{"required": ["approvers"]}, {"required": ["ttl"]}]}
                    },
                },
                {
                    "if": {"properties": {"effect": {"enum": ["allow", "hide"]}}},
                    "then": {
                        "not": {
                            "anyOf": [{"required": ["message"]}, {"required": ["message_expr"]}]
                        }
                    },
                },
            ]
        }
    )

    id: Annotated[str, Field(max_length=128, json_schema_extra={"pattern": RULE_ID})]
    """Unique across the policy set; decisions and audit records name it."""
    capabilities: Annotated[
        list[
            Annotated[
                str, AfterValidator(_glob_can_match), Field(json_schema_extra={"pattern": GLOB})
            ]
        ],
        Field(min_length=1),
    ]
    """Glob patterns over capability ids, e.g. ``orders.*``."""
    effect: Effect
    """allow, deny, require_approval or hide."""
    # A bare `when: true` is YAML's boolean; the model reads it as the CEL literal.
    when: Annotated[str, Field(json_schema_extra={"type": ["string", "boolean"]})] = "true"
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

    @field_validator("id")
    @classmethod
    def _id_shape(cls, value: str) -> str:
        if not re.match(RULE_ID, value):
            raise ValueError(
                "a rule id is lowercase letters, digits, '.', '_' and '-', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("when", "message_expr", "approvers", mode="before")
    @classmethod
    def _yaml_booleans_are_expressions(cls, value: Any) -> Any:
        # `when: true` is a YAML boolean, but the author meant the CEL literal.
        return str(value).lower() if isinstance(value, bool) else value

    @field_validator("ttl", mode="before")
    @classmethod
    def _ttl_has_a_unit(cls, value: Any) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(f"{value} has no unit: give a duration like 90s, 30m, 1h or 7d")
        return value

    @field_validator("ttl")
    @classmethod
    def _ttl_is_duration(cls, value: str | None) -> str | None:
        if value is not None and parse_duration(value, longest_days=MAX_TTL_DAYS) <= 0:
            raise ValueError(
                f"{value!r}: an approval request open for no time expires at once;"
                " give a duration above zero, like 1h"
            )
        return value


class Limit(_Strict):
    """One limit: for the capabilities its globs match, when ``when`` holds,
    count calls (``rate``), what they spend (``budget``) or how many run at
    once (``concurrency``), per value of ``key``."""

    id: Annotated[str, Field(max_length=128, json_schema_extra={"pattern": RULE_ID})]
    """Unique across the policy set (rules and limits); refusals name it."""
    capabilities: Annotated[
        list[
            Annotated[
                str, AfterValidator(_glob_can_match), Field(json_schema_extra={"pattern": GLOB})
            ]
        ],
        Field(min_length=1),
    ]
    """Glob patterns over capability ids, e.g. ``orders.*``."""
    key: str | None = None
    """A CEL string: calls with the same key are counted together (e.g.
    ``actor.tenant``); one count for every call when absent."""
    when: Annotated[str, Field(json_schema_extra={"type": ["string", "boolean"]})] = "true"
    """A CEL condition: the limit counts only the calls for which it holds."""
    rate: Annotated[str | None, Field(json_schema_extra={"pattern": PER})] = None
    """A token bucket: calls per period, e.g. ``10/min``."""
    burst: Annotated[int | None, Field(ge=1)] = None
    """rate only: how many calls may come at once (the bucket's size); the
    rate's count by default."""
    budget: Annotated[str | None, Field(json_schema_extra={"pattern": PER})] = None
    """A sum of ``cost`` over a window, e.g. ``5000/day``."""
    cost: str | None = None
    """budget only: a CEL number, what one call spends (1 when absent)."""
    window: Literal["sliding", "calendar"] = "sliding"
    """budget only: ``sliding`` (the last period) or ``calendar`` (the
    current UTC minute, hour or day, from its start)."""
    concurrency: Annotated[int | None, Field(ge=1)] = None
    """How many calls may be between grant and outcome at once."""
    message: str | None = None
    """The public message of a refusal, written as an instruction to the model."""
    mode: Literal["enforce", "audit"] = "enforce"
    """audit: recorded ("would have limited") but not enforced."""
    description: str | None = None
    """For people reading the policy; never shown to models."""

    @field_validator("id")
    @classmethod
    def _id_shape(cls, value: str) -> str:
        return Rule._id_shape(value)

    @field_validator("when", "key", "cost", mode="before")
    @classmethod
    def _yaml_scalars_are_expressions(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return str(value).lower()
        return str(value) if isinstance(value, int | float) else value

    @field_validator("rate")
    @classmethod
    def _rate_shape(cls, value: str | None) -> str | None:
        if value is not None:
            parse_per(value, whole=True)
        return value

    @field_validator("budget")
    @classmethod
    def _budget_shape(cls, value: str | None) -> str | None:
        if value is not None:
            parse_per(value, whole=False)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Limit:
        kinds = [k for k in ("rate", "budget", "concurrency") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("a limit has exactly one of rate, budget or concurrency")
        for key, owner in (("burst", "rate"), ("cost", "budget")):
            if getattr(self, key) is not None and kinds[0] != owner:
                raise ValueError(f"'{key}' applies only to {owner} limits")
        if self.window != "sliding" and kinds[0] != "budget":
            raise ValueError("'window' applies only to budget limits")
        if self.window == "calendar":
            assert self.budget is not None
            if parse_per(self.budget, whole=False)[1] not in (1, 60, 3600, 86400):
                raise ValueError(
                    "a calendar window is one second, minute, hour or day (e.g. 5000/day)"
                )
        return self

    @property
    def kind(self) -> Literal["rate", "budget", "concurrency"]:
        if self.rate is not None:
            return "rate"
        return "budget" if self.budget is not None else "concurrency"


NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""The name of a constant or variable: a CEL identifier."""


def _names_are_identifiers(value: dict[str, Any]) -> dict[str, Any]:
    for name in value:
        if not re.match(NAME, name):
            raise ValueError(
                f"{name!r} is not a name: use letters, digits and '_', starting with a letter"
            )
    return value


class PolicyFile(_Strict):
    """A policy file: constants, variables and a list of rules."""

    constants: Annotated[
        dict[str, Any],
        AfterValidator(_names_are_identifiers),
        Field(json_schema_extra={"propertyNames": {"pattern": NAME}}),
    ] = {}
    """Named values (strings, numbers, booleans, lists, maps), read as
    ``c.name`` in this file's expressions."""
    variables: Annotated[
        dict[str, Annotated[str, Field(json_schema_extra={"type": ["string", "boolean"]})]],
        AfterValidator(_names_are_identifiers),
        Field(json_schema_extra={"propertyNames": {"pattern": NAME}}),
    ] = {}
    """Named CEL expressions, read as ``v.name`` in this file's expressions
    (and in other variables); each is written out where it is used."""
    rules: list[Rule] = []
    """The rules of this file; ids are unique across every file of the folder."""
    limits: list[Limit] = []
    """Rate limits, spend budgets and concurrency caps, checked after the rules
    allowed a call (see docs/limits.md); ids share the rules' namespace."""

    @field_validator("variables", mode="before")
    @classmethod
    def _yaml_booleans_are_expressions(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: str(v).lower() if isinstance(v, bool) else v for k, v in value.items()}
        return value


class TestActor(_Strict):
    """The actor a test case decides for (the ``actor`` variable)."""

    id: str = "test-actor"
    roles: list[str] = []
    tenant: str = ""
    attrs: dict[str, Any] = {}


class TestCapability(_Strict):
    """The capability a test case calls (the ``capability`` variable)."""

    id: str
    version: str = "1"
    service: str = ""
    side_effect: Literal["read", "write", "idempotent"] = "write"
    tags: list[str] = []


Outcome = Literal["allow", "deny", "require_approval", "hide", "error"]


class Expectation(_Strict):
    """What a test case expects of the decision."""

    effect: Outcome
    """The decision; ``error`` means a policy failed (POLICY_FAILED)."""
    rule: str | None = None
    """The deciding rule's id."""
    message: str | None = None
    """The public message."""
    would_have: Outcome | None = None
    """The decision had the audit-mode rules been enforced."""
    limit: str | None = None
    """The limit that refuses the call (RATE_LIMITED, or POLICY_DENIED for a
    cost above the whole budget), given the case's ``usage``."""


class PolicyTest(_Strict):
    """One policy test case (SPEC §6)."""

    name: str
    """Shown on the pass/fail line and matched by ``--run``."""
    capability: str | TestCapability
    """A capability id, or the capability's fields."""
    actor: TestActor = TestActor()
    input: dict[str, Any] = {}
    """The validated input (``input``)."""
    context: dict[str, Any] = {}
    """Caller-supplied attributes (``context``); ``surface`` defaults to direct."""
    now: str | None = None
    """An RFC 3339 timestamp; the test run's start when absent."""
    usage: dict[str, Annotated[float, Field(ge=0)]] = {}
    """Prior usage of limits by this call's key, by limit id: tokens spent
    (rate), cost spent in the window (budget) or calls running (concurrency)."""
    expect: Expectation

    @field_validator("now", mode="before")
    @classmethod
    def _now_is_timestamp(cls, value: Any) -> Any:
        if isinstance(value, datetime):  # YAML reads an unquoted timestamp itself
            value = value.isoformat()
        if isinstance(value, str):
            parse_timestamp(value)
        return value


class PolicyTestFile(_Strict):
    """A policy test file (``policies/tests/*.yaml``)."""

    tests: list[PolicyTest]


def json_schema(*, tests: bool = False) -> dict[str, Any]:
    """The JSON Schema of policy files (or policy test files), for editors."""
    model = PolicyTestFile if tests else PolicyFile
    what = "policy test file" if tests else "policy file"
    schema = model.model_json_schema()
    docs = _field_docs()
    for name, defined in [(model.__name__, schema), *schema.get("$defs", {}).items()]:
        for field, doc in docs.get(name, {}).items():
            described = defined["properties"][field] | {"description": doc}
            defined["properties"][field] = dict(sorted(described.items()))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
        "title": f"Warden {what}",
    }


@cache
def _field_docs() -> dict[str, dict[str, str]]:
    """The text under each field of this module's models, by class and field.

    Read from the source when a schema is asked for. pydantic reads the same
    (``use_attribute_docstrings``) when it makes each class, and then looked up
    every loaded module for each: about 80 ms of every process's start.
    """
    docs: dict[str, dict[str, str]] = {}
    for node in ast.parse(Path(__file__).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            docs[node.name] = {
                field.target.id: inspect.cleandoc(text.value.value)
                for field, text in zip(node.body, node.body[1:], strict=False)
                if isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(text, ast.Expr)
                and isinstance(text.value, ast.Constant)
                and isinstance(text.value.value, str)
            }
    return docs
