"""The fast evaluator: Google's C++ CEL runtime through ``cel-expr-python``.

cel-python (``policy/cel.py``) stays the reference. Every expression is
compiled by both: the reference program supplies what the checker reads
(variables, field paths, size and depth) and remains available through
``Program.reference``, so one compiled set can be evaluated either way and
the two compared (``policy/agreement.py``). Requests are evaluated by the C++
program only, for a policy set on which the two agree.

The C++ runtime is an optional dependency in spirit: where the wheel is
missing (a platform without one), ``available()`` says so and the plane
serves with the reference evaluator, saying why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from warden_server.policy.cel import (
    Activation,
    CelPythonEvaluator,
    EvaluationError,
    Evaluator,
    Program,
)

try:
    from cel_expr_python import cel
except ImportError:  # pragma: no cover - the wheel exists for the platforms CI runs on
    cel = None

NAME: Final = "cel-cpp"

VARIABLES: Final = ("actor", "approver", "requester", "capability", "input", "context")
"""The variables of every expression kind (``policy/variables.py``). They are
declared dynamic here: what a rule may read is the loader's to check."""


def available() -> str | None:
    """None when the C++ runtime can be used, else why not."""
    if cel is None:
        return "the package cel-expr-python is not installed"
    return None


class _CppActivation:
    """Variables for the C++ runtime, converted into its values when a
    program first reads them: a capability without hide rules never converts
    the variables its visibility step is given, and an activation extended
    (with ``input``) before any program ran is converted once, not twice."""

    __slots__ = ("_env", "_native", "values")

    def __init__(self, values: dict[str, Any], env: Any) -> None:
        self.values = values
        """The plain variables: an activation with more variables starts from these."""
        self._env = env
        self._native: Any = None

    @property
    def native(self) -> Any:
        """``cel.Activation``: the variables converted once into C++ values."""
        if self._native is None:
            # Two threads converting at once both build the same values.
            self._native = self._env.Activation(self.values)
        return self._native


class _CppProgram:
    """A C++ program, described by the reference program of the same text."""

    __slots__ = (
        "_expression",
        "comprehension_depth",
        "depth",
        "free_variables",
        "problem",
        "reference",
        "references",
        "size",
    )

    def __init__(self, expression: Any, reference: Program, problem: str | None = None) -> None:
        self._expression = expression
        self.problem = problem
        """Why the C++ runtime could not compile the expression, when it could not."""
        self.reference = reference
        """The same expression compiled by the reference evaluator."""
        self.free_variables = reference.free_variables
        self.references = reference.references
        self.size = reference.size
        self.depth = reference.depth
        self.comprehension_depth = reference.comprehension_depth

    def evaluate(self, activation: Activation) -> Any:
        assert isinstance(activation, _CppActivation)
        if self._expression is None:
            raise EvaluationError(f"{NAME} cannot run this expression: {self.problem}")
        try:
            value = self._expression.eval(activation.native)
        except (RuntimeError, ValueError, TypeError, OverflowError) as exc:
            raise EvaluationError(f"{type(exc).__name__}: {exc}") from None
        kind = value.type()
        if kind == cel.Type.ERROR:
            raise EvaluationError(_error_message(value.value()))
        if kind in (cel.Type.BOOL, cel.Type.STRING):
            return value.value()
        return value.plain_value()


class CelCppEvaluator:
    """Compile with both runtimes; evaluate with the C++ one.

    Compiled programs and activations are safe to share between request
    threads: the C++ runtime keeps no per-evaluation state in a program.
    """

    name = NAME

    def __init__(self, reference: CelPythonEvaluator | None = None) -> None:
        problem = available()
        if problem is not None:
            raise RuntimeError(problem)
        self._reference = reference or CelPythonEvaluator()
        self.reference: Evaluator = self._reference
        dyn = cel.Type.DYN
        declared = dict.fromkeys(VARIABLES, dyn)
        declared["now"] = cel.Type.TIMESTAMP
        self._env = cel.NewEnv(variables=declared)

    def compile(self, expression: str) -> Program:
        reference = self._reference.compile(expression)  # syntax errors, with positions
        try:
            return _CppProgram(self._env.compile(expression), reference)
        except Exception as exc:  # the binding raises plain exceptions for every kind
            # Not a problem of the policy: the set is served by the reference,
            # which says why (``policy/serving.py``).
            return _CppProgram(None, reference, problem=str(exc).strip())

    def activation(
        self, variables: Mapping[str, Any], base: Activation | None = None
    ) -> Activation:
        values: dict[str, Any] = {}
        if base is not None:
            assert isinstance(base, _CppActivation)
            values.update(base.values)
        values.update(variables)
        # A value C++ CEL cannot hold (an integer beyond 64 bits, say) is not
        # refused when converted: it becomes an error value, and a rule
        # reading it fails closed.
        return _CppActivation(values, self._env)


def unsupported(program: Program) -> str | None:
    """Why a program cannot run on the C++ runtime, or None when it can."""
    return program.problem if isinstance(program, _CppProgram) else None


def _error_message(error: Any) -> str:
    """A C++ status as text, without the status code's name in capitals."""
    text = str(error)
    code, sep, rest = text.partition(": ")
    return rest if sep and code.isupper() else text
