"""The CEL evaluator behind a narrow interface: compile, then evaluate many times.

cel-python is the reference evaluator. A faster one can sit beside it by
implementing ``Evaluator`` and passing the policy test suite identically.
"""

from __future__ import annotations

import functools
import logging
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import celpy
import lark
import lark.exceptions
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from warden_server.policy import grammar

MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})

# cel-python logs whole activations, inputs included, at DEBUG (and a failing
# function's arguments at ERROR): sensitive values in clear (SI-5). Its errors
# come back to us as values and are recorded, scrubbed, in the audit log.
logging.getLogger("celpy").setLevel(logging.CRITICAL)


class CompileError(Exception):
    """An expression does not parse; ``line``/``column`` are 1-based within it."""

    def __init__(self, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


class EvaluationError(Exception):
    """An expression failed at run time (missing field, bad types, ...)."""


class Activation(Protocol):
    """The variables of one decision, converted once for the evaluator."""


@dataclass(frozen=True, slots=True)
class Reference:
    """A variable an expression reads, with the longest field path read under it
    (``input.amount`` is ("input", ("amount",))), and where it starts."""

    variable: str
    path: tuple[str, ...]
    line: int
    column: int


class Program(Protocol):
    """A compiled expression."""

    free_variables: frozenset[str]
    """The top-level variables the expression reads."""
    references: tuple[Reference, ...]
    """Every read of a free variable, in source order."""
    size: int
    """The number of syntax nodes: the basis of the cost limit."""
    depth: int
    """The depth of the syntax tree: evaluation recursion grows with it."""
    comprehension_depth: int
    """How deeply comprehensions (all, exists, map, filter) nest: each level
    multiplies the work by the length of a list."""

    @property
    def reference(self) -> Program:
        """The same expression compiled by the reference evaluator (itself, for
        a reference program): what a faster program is compared with."""
        ...

    def evaluate(self, activation: Activation) -> Any:
        """The expression's value as plain Python (bool, str, int, ...).

        Raises:
            EvaluationError: the expression failed.
        """
        ...


class Evaluator(Protocol):
    name: str
    """How the evaluator is named in logs, audit records and policy test reports."""

    @property
    def reference(self) -> Evaluator:
        """The reference evaluator (itself, for the reference)."""
        ...

    def compile(self, expression: str) -> Program:
        """Parse and prepare an expression.

        Raises:
            CompileError: the expression does not parse.
        """
        ...

    def activation(
        self, variables: Mapping[str, Any], base: Activation | None = None
    ) -> Activation:
        """Convert ``variables`` once, for many evaluations; with ``base``, the
        base's variables plus these, converting only these."""
        ...


@dataclass(frozen=True, slots=True)
class _CelActivation:
    values: dict[str, Any]


class _CelProgram:
    def __init__(self, runner: celpy.Runner, tree: lark.Tree[Any]) -> None:
        self._runner = runner
        subtrees = list(tree.iter_subtrees())  # walked once: lark's walk is costly
        self.free_variables = frozenset(_free_identifiers(subtrees))
        self.references = _references(subtrees, self.free_variables)
        self.size = len(subtrees)
        self.depth = _depth(tree)
        self.comprehension_depth = _comprehension_depth(tree)

    @property
    def reference(self) -> Program:
        """Itself (a property: an attribute naming itself is a reference
        cycle, which only the cycle collector would free)."""
        return self

    def evaluate(self, activation: Activation) -> Any:
        assert isinstance(activation, _CelActivation)
        try:
            value = self._runner.evaluate(activation.values)
        except CELEvalError as exc:
            raise EvaluationError(_eval_message(exc)) from None
        except (TypeError, ValueError, KeyError, ZeroDivisionError, OverflowError) as exc:
            raise EvaluationError(f"{type(exc).__name__}: {exc}") from None
        except RecursionError:
            # The cost limit keeps checked policies far from this; fail closed anyway.
            raise EvaluationError("expression nests too deeply to evaluate") from None
        if isinstance(value, CELEvalError):
            raise EvaluationError(_eval_message(value))
        return _to_python(value)


_CEL_TYPES: dict[type, Callable[[Any], Any]] = {
    str: celtypes.StringType,
    list: celtypes.ListType,
    bytes: celtypes.BytesType,
    float: celtypes.DoubleType,
}


def _typed(operation: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A CEL operator whose result has the CEL type of its operands.

    cel-python applies Python's ``+``, ``-`` and ``*``, which make ``"a" + "b"``
    a plain ``str`` (and lists, bytes and doubles alike): a value without the
    CEL type's methods, so ``("a" + "b").contains("b")`` failed with "no such
    overload", and ``type(2.5 - 1.0) == double`` was false, where CEL answers
    true to both.
    """

    def apply(left: Any, right: Any) -> Any:
        result = operation(left, right)
        cel_type = _CEL_TYPES.get(type(result))
        return result if cel_type is None else cel_type(result)

    apply.__name__ = operation.__name__
    return apply


_FUNCTIONS = {
    "_+_": _typed(operator.add),
    "_-_": _typed(operator.sub),
    "_*_": _typed(operator.mul),
}
"""cel-python's own functions, corrected where they differ from CEL."""


@functools.cache
def parser() -> celpy.Environment:
    """cel-python's parser, for syntax trees. Made on first use (``grammar``),
    not on import: a command that never reads a condition does not need it."""
    grammar.ready()
    return celpy.Environment()


@functools.lru_cache(maxsize=256)
def parse(text: str) -> lark.Tree[Any]:
    """cel-python's syntax tree of ``text``, shared: a tree is only read.

    The latest few are kept. A condition is parsed when it is compiled, and
    the checks that follow at once (its constant failures, its coverage)
    read the same tree instead of parsing it again: about 2 ms each.

    Raises:
        CELParseError: ``text`` is not CEL.
        RecursionError: it nests too deeply to parse.
    """
    return parser().compile(text)


class CelPythonEvaluator:
    """The reference evaluator: cel-python's interpreter.

    Programs evaluate with a fresh interpreter per call, so one compiled
    program serves every request thread.
    """

    name = "cel-python"

    def __init__(self) -> None:
        grammar.ready()
        self._env = celpy.Environment()

    @property
    def reference(self) -> Evaluator:
        """Itself."""
        return self

    def compile(self, expression: str) -> Program:
        try:
            tree = parse(expression)
        except CELParseError as exc:
            raise CompileError(
                f"CEL syntax error: {_syntax_problem(exc)}",
                line=getattr(exc, "line", None) or 1,
                column=getattr(exc, "column", None) or 1,
            ) from None
        except RecursionError:
            raise CompileError("expression nests too deeply to parse") from None
        return _CelProgram(self._env.program(tree, functions=_FUNCTIONS), tree)

    def activation(
        self, variables: Mapping[str, Any], base: Activation | None = None
    ) -> Activation:
        converted: dict[str, Any] = {}
        if base is not None:
            assert isinstance(base, _CelActivation)
            converted.update(base.values)
        for name, value in variables.items():
            if isinstance(value, datetime):
                converted[name] = celtypes.TimestampType(value)
            else:
                converted[name] = json_to_cel(value)
        return _CelActivation(converted)


_PY_OVERLOAD = re.compile(
    # The operator is the syntax tree's rule name: a Lark token where Lark
    # built the parser, plain text where it was loaded (``policy.grammar``).
    r"found no matching overload for (?:Token\('RULE', '(\w+)'\)|'(\w+)') applied to '\((.*)\)'"
)
_PY_CLASS = re.compile(r"<class 'celpy\.celtypes\.(\w+?)(?:Type)?'>")
_CPP_OVERLOAD = re.compile(r"No matching overloads found : ([^\s(]+)\((.*)\)")
_KEY = re.compile(r"""(?:no such member in mapping: '([^']*)'|Key not found in map : "([^"]*)")""")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_PY_REPR = re.compile(r"\b\w+Type\([^)]*\)")
_PY_OPERATORS = {
    "relation_gt": ">",
    "relation_lt": "<",
    "relation_ge": ">=",
    "relation_le": "<=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "relation_in": "in",
    "addition_add": "+",
    "addition_sub": "-",
    "multiplication_mul": "*",
    "multiplication_div": "/",
    "multiplication_mod": "%",
    "unary_not": "!",
    "unary_neg": "-",
}
_CPP_OPERATORS = {
    "_>_": ">",
    "_<_": "<",
    "_>=_": ">=",
    "_<=_": "<=",
    "_==_": "==",
    "_!=_": "!=",
    "@in": "in",
    "_+_": "+",
    "_-_": "-",
    "_*_": "*",
    "_/_": "/",
    "_%_": "%",
    "!_": "!",
    "-_": "-",
    "_[_]": "[]",
}
_CPP_TYPES = {"int64": "int", "uint64": "uint", "null_type": "null"}
MAX_ERROR_CHARS = 200


def error_in_words(message: str, expression: str) -> str:
    """An evaluation error as one line of words, the same from both evaluators.

    What is kept comes from the policy's own text: a missing key is named
    only when the expression spells it, quoted text only when the expression
    holds it; values the expression read (input, claims) are never repeated
    (SI-5).
    """
    text = message.strip().splitlines()[0] if message.strip() else "evaluation error"
    if match := _PY_OVERLOAD.search(text):
        rule = match.group(1) or match.group(2)
        operator = _PY_OPERATORS.get(rule, rule)
        types = [t.lower() for t in _PY_CLASS.findall(match.group(3))]
        return f"no operator '{operator}' for ({', '.join(types)})"
    if match := _CPP_OVERLOAD.search(text):
        name, arguments = match.groups()
        types = [_CPP_TYPES.get(t.strip(), t.strip()) for t in arguments.split(",") if t.strip()]
        symbol = _CPP_OPERATORS.get(name)
        what = f"operator '{symbol}'" if symbol else f"function '{name}'"
        return f"no {what} for ({', '.join(types)})"
    if match := _KEY.search(text):
        key = match.group(1) or match.group(2) or ""
        spelled = re.search(rf"\.{re.escape(key)}\b|['\"]{re.escape(key)}['\"]", expression)
        return f"no such key: {key}" if key and spelled else "no such key"
    if "divide by zero" in text or "modulus by zero" in text:
        return "division by zero"
    if "does not support field selection" in text or "SELECT to non-message" in text:
        return "field selection on a value that is not a map"
    text = _PY_CLASS.sub(lambda m: m.group(1).lower(), text)
    text = _PY_REPR.sub("a value", text)
    text = _QUOTED.sub(lambda m: m.group(0) if m.group(0) in expression else "…", text)
    return text[:MAX_ERROR_CHARS]


def _syntax_problem(error: CELParseError) -> str:
    """What the parser tripped on; cel-python itself only says where."""
    cause = error.__cause__ or error.__context__
    if isinstance(cause, lark.exceptions.UnexpectedCharacters):
        return f"unexpected character {cause.char!r}"
    if isinstance(cause, lark.exceptions.UnexpectedToken):
        if cause.token.type == "$END":
            return "the expression ends too soon"
        return f"unexpected {str(cause.token)!r}"
    if isinstance(cause, lark.exceptions.UnexpectedEOF):
        return "the expression ends too soon"
    return "cannot parse here"


def _eval_message(error: CELEvalError) -> str:
    return str(error.args[0]) if error.args else "evaluation error"


def _to_python(value: Any) -> Any:
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.IntType | celtypes.UintType):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    return value


def _free_identifiers(subtrees: list[lark.Tree[Any]]) -> set[str]:
    """Top-level identifiers, minus the variables that macros bind."""
    bound: set[str] = set()
    for node in subtrees:
        if node.data == "member_dot_arg" and len(node.children) >= 3:
            name = node.children[1]
            args = node.children[2]
            if str(name) in MACROS and isinstance(args, lark.Tree) and args.children:
                first = _dotted(args.children[0])
                if first and len(first) == 1:
                    bound.add(first[0])
    free = set()
    for node in subtrees:
        if node.data == "ident" and node.children:
            free.add(str(node.children[0]))
    return free - bound


def _dotted(node: Any) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"] when the node is a plain member chain."""
    while (
        isinstance(node, lark.Tree)
        and node.data
        in (
            "expr",
            "conditionalor",
            "conditionaland",
            "relation",
            "addition",
            "multiplication",
            "unary",
            "member",
            "primary",
        )
        and len(node.children) == 1
    ):
        node = node.children[0]
    if isinstance(node, lark.Tree) and node.data == "ident":
        return [str(node.children[0])]
    if isinstance(node, lark.Tree) and node.data == "member_dot" and len(node.children) == 2:
        head = _dotted(node.children[0])
        return [*head, str(node.children[1])] if head else None
    return None


def _references(subtrees: list[lark.Tree[Any]], free: frozenset[str]) -> tuple[Reference, ...]:
    """The longest member chain at each place a free variable is read."""
    longest: dict[tuple[int, int], Reference] = {}
    for node in subtrees:
        if node.data not in ("member_dot", "ident"):
            continue
        chain = _dotted(node)
        if not chain or chain[0] not in free:
            continue
        where = (node.meta.line, node.meta.column)
        known = longest.get(where)
        if known is None or len(known.path) < len(chain) - 1:
            longest[where] = Reference(chain[0], tuple(chain[1:]), *where)
    return tuple(longest[where] for where in sorted(longest))


def _comprehension_depth(tree: lark.Tree[Any]) -> int:
    deepest = 0
    stack: list[tuple[Any, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, lark.Tree):
            continue
        if (
            node.data == "member_dot_arg"
            and len(node.children) >= 2
            and str(node.children[1]) in MACROS
        ):
            depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in node.children)
    return deepest


def _depth(tree: lark.Tree[Any]) -> int:
    deepest = 0
    stack: list[tuple[Any, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, lark.Tree):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in node.children)
    return deepest
