"""The variables a policy expression sees (SPEC §6): their names, the fields
of the typed ones, and how one decision's values are put together.

The checker reads the names and fields; the pipeline, discovery and the test
runner build the values with ``decision_variables``, so all three agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

ACTOR_FIELDS: Final = ("id", "roles", "tenant", "attrs")
CAPABILITY_FIELDS: Final = ("id", "version", "service", "side_effect", "tags")

FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "actor": ACTOR_FIELDS,
    "approver": ACTOR_FIELDS,
    "requester": ACTOR_FIELDS,
    "capability": CAPABILITY_FIELDS,
}
"""Variables whose fields are fixed; ``input`` follows the capability's schema,
``context`` is whatever the caller sends (plus ``surface``)."""

WHEN: Final = frozenset({"actor", "capability", "input", "context", "now"})
"""Variables of ``when`` and ``message_expr``."""
HIDE: Final = WHEN - {"input"}
"""Variables of a hide rule's ``when``: it runs before input validation (SI-2)."""
APPROVERS: Final = frozenset({"approver", "requester", "capability", "input"})
"""Variables of ``approvers``."""

CEL_TYPE_NAMES: Final = frozenset(
    {"bool", "bytes", "double", "int", "list", "map", "null_type", "string", "type", "uint"}
)
"""Identifiers CEL itself defines (``type(x) == int``): never unknown variables."""


def decision_variables(
    *,
    actor: Mapping[str, Any],
    capability: Mapping[str, Any],
    context: Mapping[str, Any],
    surface: str,
    now: datetime,
) -> dict[str, Any]:
    """The variables of one decision, without ``input`` (added once validated)."""
    return {
        "actor": dict(actor),
        "capability": dict(capability),
        "context": {**context, "surface": surface},
        "now": now,
    }


def approver_variables(
    *,
    approver: Mapping[str, Any],
    requester: Mapping[str, Any],
    capability: Mapping[str, Any],
    input: Any,
) -> dict[str, Any]:
    """The variables of one ``approvers`` evaluation: who decides, for whom, on what."""
    return {
        "approver": dict(approver),
        "requester": dict(requester),
        "capability": dict(capability),
        "input": input,
    }
