"""Which CEL evaluator serves a policy set.

cel-python is the reference; Google's C++ CEL (``policy/celcpp.py``) is some
hundred times faster. A set is compiled by both, and the C++ runtime serves
it only when it can run every expression and decides every policy test of
the folder exactly as the reference does (SPEC §6); otherwise the reference
serves it and the reason is logged.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Final, Literal

from warden_server.policy import celcpp
from warden_server.policy.cel import CelPythonEvaluator, Evaluator
from warden_server.policy.engine import PolicySet
from warden_server.policy.loader import Problem
from warden_server.policy.testing import (
    Disagreement,
    Registered,
    TestReport,
    failing_tests,
    run_policy_tests,
    tests_digest,
)

log = logging.getLogger(__name__)

EvaluatorChoice = Literal["cel-cpp", "cel-python"]
EVALUATORS: Final = ("cel-cpp", "cel-python")

VERDICTS_KEPT: Final = 16
"""Verdicts on sets' test cases a process keeps (``serving``); the one used
least recently is dropped first."""

_Key = tuple[str, str, str, str, str, str, bool]
_Verdict = tuple[str | None, tuple[Problem, ...]]
_verdicts: OrderedDict[_Key, _Verdict] = OrderedDict()
_verdicts_lock = threading.Lock()


def evaluator_for(choice: EvaluatorChoice) -> Evaluator:
    """The evaluator to compile with: the C++ one (with its reference twin)
    when chosen and installed, else the reference."""
    if choice == "cel-cpp":
        problem = celcpp.available()
        if problem is None:
            return celcpp.CelCppEvaluator()
        log.warning("policies are evaluated by cel-python: %s", problem)
    return CelPythonEvaluator()


_PREPARED: Final = (
    '"manager" in actor.roles || (input.amount > 10.5 && !actor.id.startsWith("bot-"))'
    " ? size(input.items) : input.items.filter(i, i.n != 0).size()"
)
"""An expression like the example policies' conditions, for ``prepare``."""


def prepare() -> None:
    """Build what compiling and evaluating a first policy set builds on
    first use: cel-python's parser and the patterns of its lexer's states,
    and the C++ runtime's environment.

    A process that forks others calls this first (the forkserver, through
    ``warden_server.preload``), so that each process forked finds them
    built: that saves a joining process about 50 ms of CPU.
    """
    evaluator: Evaluator = (
        celcpp.CelCppEvaluator() if celcpp.available() is None else CelPythonEvaluator()
    )
    variables = {
        "actor": {"id": "prepare", "roles": []},
        "input": {"amount": 1.0, "items": [{"n": 1}]},
    }
    program = evaluator.compile(_PREPARED)
    program.evaluate(evaluator.activation(variables))
    program.reference.evaluate(evaluator.reference.activation(variables))


def fallback_reason(
    policies: PolicySet,
    directory: Path,
    now: datetime | None = None,
    capabilities: Mapping[str, Registered] | None = None,
) -> str | None:
    """Why ``policies`` must not be served by its (faster) evaluator, or None."""
    return _compared(policies, directory, now, capabilities)[0]


def serving(
    policies: PolicySet,
    directory: Path,
    *,
    require_passing_tests: bool = False,
    capabilities: Mapping[str, Registered] | None = None,
) -> tuple[PolicySet, list[Problem]]:
    """``policies`` as it is to be served: by its own evaluator when that
    agrees with the reference, else by the reference (saying why). With
    ``require_passing_tests``, also the folder's test cases the served set
    fails, as problems. A case naming one of the registered ``capabilities``
    by id calls it as registered (``testing.registered_capabilities``).

    The cases run once: each is decided by both evaluators, which is the
    comparison, and checked against its expectation, which is the gate. Only
    a set that falls back runs them again, on the reference.

    The verdict depends only on the folder, the set's files, its default
    effect, the evaluator, the folder's test files and the registered
    capabilities, so a process keeps
    the last few (``VERDICTS_KEPT``) and serves the same set again (a plane
    started anew in one process, a change reverted) without running the
    cases again.
    """
    key = (
        str(directory.resolve()),
        policies.revision,
        policies.default_effect,
        policies.evaluator.name,
        tests_digest(directory),
        _digest(capabilities),
        require_passing_tests,
    )
    with _verdicts_lock:
        verdict = _verdicts.get(key)
        if verdict is not None:
            _verdicts.move_to_end(key)
    if verdict is None:
        verdict = _verdict(
            policies,
            directory,
            require_passing_tests=require_passing_tests,
            capabilities=capabilities,
        )
        with _verdicts_lock:
            _verdicts[key] = verdict
            while len(_verdicts) > VERDICTS_KEPT:
                _verdicts.popitem(last=False)
    reason, failing = verdict
    if reason is None:
        return policies, list(failing)
    log.warning(
        "policy revision %s is evaluated by cel-python, not %s: %s",
        policies.revision[:12],
        policies.evaluator.name,
        reason,
    )
    return policies.reference(), list(failing)


def _verdict(
    policies: PolicySet,
    directory: Path,
    *,
    require_passing_tests: bool,
    capabilities: Mapping[str, Registered] | None,
) -> _Verdict:
    """Why the set must fall back to the reference (None when it need not),
    and, when they gate it, the test cases the set as served fails."""
    reason, report = _compared(policies, directory, capabilities=capabilities)
    if reason is not None:
        report = None  # the cases ran on the faster evaluator: run them on the reference
    if not require_passing_tests:
        return reason, ()
    if report is None:
        served = policies.reference() if reason is not None else policies
        report = run_policy_tests(served, directory, conditions=False, capabilities=capabilities)
    return reason, tuple(failing_tests(report))


def _digest(capabilities: Mapping[str, Registered] | None) -> str:
    """What of the registered capabilities the test cases can see, in short."""
    if capabilities is None:
        return ""
    digests = sorted(c.digest() for c in capabilities.values())
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()


def _compared(
    policies: PolicySet,
    directory: Path,
    now: datetime | None = None,
    capabilities: Mapping[str, Registered] | None = None,
) -> tuple[str | None, TestReport | None]:
    """Why ``policies`` must fall back to the reference (None when it need
    not), and the run of the folder's cases that compared the two evaluators
    (None when no case ran)."""
    if policies.reference() is policies:
        return None, None
    reason = _unsupported(policies)
    if reason is not None:
        return reason, None
    report = run_policy_tests(
        policies, directory, now=now, conditions=False, capabilities=capabilities
    )
    return _first([case.disagreement for case in report.cases if case.disagreement]), report


def _unsupported(policies: PolicySet) -> str | None:
    """The first expression the set's evaluator cannot run, where it is."""
    for rule in policies.rules:
        for kind, program in (
            ("when", rule.when),
            ("message_expr", rule.message_expr),
            ("approvers", rule.approvers),
        ):
            problem = celcpp.unsupported(program) if program is not None else None
            if problem is not None:
                return f"{rule.file}:{rule.line}: rule {rule.id!r}: {kind}: {problem}"
    return None


def _first(found: Sequence[Disagreement]) -> str | None:
    if not found:
        return None
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"{found[0]}{more}"
