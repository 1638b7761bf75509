"""A policy file's ``constants:`` and ``variables:``, written out in its rules.

``c.name`` stands for a constant (a YAML value) and ``v.name`` for a
variable (a CEL expression, which may use constants and other variables).
Both are expanded where they are used: ``v.name`` becomes the variable's
expression in parentheses, ``c.name`` the constant as a CEL literal. The
expanded text is what is checked, compiled and run, on either evaluator,
so a definition behaves exactly as if it were written out in each rule.

Every character of an expanded text remembers where it came from (the
rule's text, or a variable's), so a problem found in it is reported where
the author wrote it: inside the variable's definition, or at the ``v.name``
that brought it in.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import lark

from warden_server.policy import yamlpos
from warden_server.policy.cel import MACROS, parse

VARIABLES: Final = "v"
CONSTANTS: Final = "c"
_MAY_REFER: Final = re.compile(r"(?<![\w.])[vc]\s*\.")
"""Where a ``v.name`` or ``c.name`` could start (a string literal may match too:
that costs a parse, never a miss)."""

Report = Callable[[yamlpos.Path, int, str], None]
"""Report a problem at (path of the source text, offset in it, message)."""


@dataclass(frozen=True, slots=True)
class Expansion:
    """An expression with its definitions written out, and the origin of
    each of its characters: (path of the text it came from, offset there)."""

    text: str
    origins: tuple[tuple[yamlpos.Path, int], ...]

    def origin(self, line: int, column: int) -> tuple[yamlpos.Path, int]:
        """Where the character at 1-based (``line``, ``column``) was written."""
        offset = _offset(self.text, line, column)
        if not self.origins:
            return (), 0
        return self.origins[min(max(offset, 0), len(self.origins) - 1)]


def identity(path: yamlpos.Path, text: str) -> Expansion:
    return Expansion(text, tuple((path, i) for i in range(len(text))))


def constant_literal(value: Any) -> str:
    """A JSON value as a CEL literal.

    Raises:
        ValueError: the value has no CEL literal (a date, an infinite number).
    """
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("a constant must be a finite number")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=True)
    if isinstance(value, list):
        return "[" + ", ".join(constant_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError("the keys of a constant map must be strings")
            items.append(f"{json.dumps(key)}: {constant_literal(item)}")
        return "{" + ", ".join(items) + "}"
    raise ValueError(
        f"a constant is a string, number, boolean, null, list or map, not {type(value).__name__}"
        " (quote dates and times)"
    )


class Definitions:
    """One file's constants and variables, expanded on demand."""

    def __init__(
        self, constants: Mapping[str, Any], variables: Mapping[str, str], report: Report
    ) -> None:
        self._constants = constants
        self._variables = variables
        self._report = report
        self._expanded: dict[str, Expansion | None] = {}
        self._expanding: list[str] = []
        self._literals: dict[str, str | None] = {}

    @property
    def variable_names(self) -> list[str]:
        return sorted(self._variables)

    def variable_path(self, name: str) -> yamlpos.Path:
        return ("variables", name)

    def parses(self, name: str) -> bool:
        """Whether the variable's expression parses."""
        try:
            parse(self._variables[name])
        except Exception:
            return False
        return True

    def check_constants(self) -> None:
        """Report every constant that has no CEL literal, used or not."""
        for name in sorted(self._constants):
            self._literal(name)

    def variable(self, name: str) -> Expansion | None:
        """A variable's expression, expanded; None when it cannot be (the
        problem is reported once, at the definition)."""
        if name in self._expanded:
            return self._expanded[name]
        if not self.parses(name):  # reported where the variable is checked
            self._expanded[name] = None
            return None
        self._expanding.append(name)
        found = self.expand(self.variable_path(name), self._variables[name])
        self._expanding.pop()
        self._expanded[name] = found
        return found

    def expand(self, path: yamlpos.Path, text: str) -> Expansion | None:
        """``text`` (written at ``path``) with every ``v.name`` and ``c.name``
        written out; None after reporting a reference that cannot be."""
        if not _MAY_REFER.search(text):  # no v.name or c.name: nothing to parse
            return identity(path, text)
        try:
            tree = parse(text)
        except Exception:  # a syntax error: compiling reports it, at its place
            return identity(path, text)
        uses = _uses(tree)
        if not uses:
            return identity(path, text)
        pieces: list[tuple[str, tuple[tuple[yamlpos.Path, int], ...]]] = []
        done = 0
        ok = True
        for kind, name, start, end in uses:
            pieces.append((text[done:start], tuple((path, i) for i in range(done, start))))
            done = end
            written = self._written(kind, name, path, start)
            if written is None:
                ok = False
                continue
            inner, origins = written
            if kind == VARIABLES:
                inner = f"({inner})"
                origins = ((path, start), *origins, (path, end - 1))
            else:
                origins = tuple((path, start) for _ in inner)
            pieces.append((inner, origins))
        pieces.append((text[done:], tuple((path, i) for i in range(done, len(text)))))
        if not ok:
            return None
        return Expansion("".join(p[0] for p in pieces), tuple(o for p in pieces for o in p[1]))

    def _written(
        self, kind: str, name: str, path: yamlpos.Path, at: int
    ) -> tuple[str, tuple[tuple[yamlpos.Path, int], ...]] | None:
        if kind == CONSTANTS:
            if name not in self._constants:
                known = ", ".join(sorted(self._constants)) or "none"
                self._report(
                    path, at, f"unknown constant 'c.{name}' (constants of this file: {known})"
                )
                return None
            literal = self._literal(name)
            return (literal, ()) if literal is not None else None
        if name not in self._variables:
            known = ", ".join(sorted(self._variables)) or "none"
            self._report(path, at, f"unknown variable 'v.{name}' (variables of this file: {known})")
            return None
        if name in self._expanding:
            cycle = [*self._expanding[self._expanding.index(name) :], name]
            self._report(path, at, f"variable 'v.{name}' refers to itself ({' → '.join(cycle)})")
            return None
        found = self.variable(name)
        return (found.text, found.origins) if found is not None else None

    def _literal(self, name: str) -> str | None:
        if name not in self._literals:
            try:
                self._literals[name] = constant_literal(self._constants[name])
            except ValueError as exc:
                self._report(("constants", name), -1, str(exc))
                self._literals[name] = None
        return self._literals[name]


def _uses(tree: lark.Tree[Any]) -> list[tuple[str, str, int, int]]:
    """Every ``v.name``/``c.name`` read: (v or c, name, start, end), in order,
    unless a macro binds ``v`` or ``c`` as its own variable."""
    bound = set()
    found = []
    for node in tree.iter_subtrees():
        is_macro = node.data == "member_dot_arg" and len(node.children) >= 3
        if is_macro and str(node.children[1]) in MACROS:
            arguments = node.children[2]
            if isinstance(arguments, lark.Tree) and arguments.children:
                bound.add(_ident(arguments.children[0]))
        if node.data == "member_dot" and len(node.children) == 2:
            head = _ident(node.children[0])
            if head in (VARIABLES, CONSTANTS):
                found.append((head, str(node.children[1]), node.meta.start_pos, node.meta.end_pos))
    return sorted((use for use in found if use[0] not in bound), key=lambda use: use[2])


def _ident(node: Any) -> str | None:
    """The identifier a node is, through the one-child wrappers."""
    while isinstance(node, lark.Tree) and len(node.children) == 1 and node.data != "ident":
        node = node.children[0]
    if isinstance(node, lark.Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def _offset(text: str, line: int, column: int) -> int:
    start = 0
    for _ in range(max(line, 1) - 1):
        newline = text.find("\n", start)
        if newline < 0:
            break
        start = newline + 1
    return start + max(column, 1) - 1


def line_column(text: str, offset: int) -> tuple[int, int]:
    """The 1-based (line, column) of ``offset`` in ``text``."""
    before = text[: max(offset, 0)]
    line = before.count("\n") + 1
    return line, offset - (before.rfind("\n") + 1) + 1
