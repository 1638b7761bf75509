"""Which CEL evaluator serves a policy set.

cel-python is the reference; Google's C++ CEL (``policy/celcpp.py``) is some
hundred times faster. A set is compiled by both, and the C++ runtime serves
it only when it can run every expression and decides every policy test of
the folder exactly as the reference does (SPEC §6); otherwise the reference
serves it and the reason is logged.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Final, Literal

from warden_server.policy import celcpp
from warden_server.policy.cel import CelPythonEvaluator, Evaluator
from warden_server.policy.engine import PolicySet
from warden_server.policy.testing import disagreements

log = logging.getLogger(__name__)

EvaluatorChoice = Literal["cel-cpp", "cel-python"]
EVALUATORS: Final = ("cel-cpp", "cel-python")


def evaluator_for(choice: EvaluatorChoice) -> Evaluator:
    """The evaluator to compile with: the C++ one (with its reference twin)
    when chosen and installed, else the reference."""
    if choice == "cel-cpp":
        problem = celcpp.available()
        if problem is None:
            return celcpp.CelCppEvaluator()
        log.warning("policies are evaluated by cel-python: %s", problem)
    return CelPythonEvaluator()


def fallback_reason(
    policies: PolicySet, directory: Path, now: datetime | None = None
) -> str | None:
    """Why ``policies`` must not be served by its (faster) evaluator, or None."""
    if policies.reference() is policies:
        return None
    for rule in policies.rules:
        for kind, program in (
            ("when", rule.when),
            ("message_expr", rule.message_expr),
            ("approvers", rule.approvers),
        ):
            problem = celcpp.unsupported(program) if program is not None else None
            if problem is not None:
                return f"{rule.file}:{rule.line}: rule {rule.id!r}: {kind}: {problem}"
    found = disagreements(policies, directory, now)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        return f"{found[0]}{more}"
    return None


def serving(policies: PolicySet, directory: Path) -> PolicySet:
    """``policies`` as it is to be served: by its own evaluator when that
    agrees with the reference, else by the reference (saying why)."""
    reason = fallback_reason(policies, directory)
    if reason is None:
        return policies
    log.warning(
        "policy revision %s is evaluated by cel-python, not %s: %s",
        policies.revision[:12],
        policies.evaluator.name,
        reason,
    )
    return policies.reference()
