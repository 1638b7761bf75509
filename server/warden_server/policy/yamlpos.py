"""YAML with positions: plain data plus the line and column of every node,
so that every problem can be reported as ``file:line:col``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import yaml

Path = tuple[str | int, ...]

_COMPOSER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML was built with it (the wheels are): the same
nodes and marks, several times faster than the pure-Python one."""


class Position(NamedTuple):
    """A 1-based line and column (a tuple: one is made for every node of
    every policy file, and a tuple is the cheapest thing to make)."""

    line: int
    column: int


@dataclass(frozen=True, slots=True)
class Scalar:
    """Where a scalar's text stands, to map a position inside it to the file."""

    style: str | None
    """None (plain), ``'``, ``"``, ``|`` or ``>``."""
    start: Position
    end_line: int
    content_indent: int
    """For block scalars: the column (1-based) where their lines start."""


@dataclass(slots=True)
class Document:
    """A parsed YAML document: the data and where each part of it stands."""

    data: Any
    positions: dict[Path, Position] = field(default_factory=dict)
    keys: dict[Path, Position] = field(default_factory=dict)
    scalars: dict[Path, Scalar] = field(default_factory=dict)
    duplicates: list[tuple[Path, Position]] = field(default_factory=list)

    def position(self, path: Path) -> Position:
        """The position of ``path``'s value, or of its nearest ancestor that exists."""
        while path not in self.positions and path:
            path = path[:-1]
        return self.positions.get(path, Position(1, 1))

    def key_position(self, path: Path) -> Position:
        """The position of the key that names ``path`` (its value's when unknown)."""
        return self.keys.get(path) or self.position(path)

    def position_in(self, path: Path, line: int, column: int) -> Position:
        """The file position of (``line``, ``column``), 1-based, inside the
        scalar at ``path`` — exact for one-line scalars and literal blocks,
        the scalar's start where folding makes it ambiguous."""
        scalar = self.scalars.get(path)
        if scalar is None:
            return self.position(path)
        if scalar.style == "|":
            return Position(scalar.start.line + line, scalar.content_indent + column - 1)
        if scalar.style != ">" and line == 1 and scalar.end_line == scalar.start.line:
            quote = 1 if scalar.style in ("'", '"') else 0
            return Position(scalar.start.line, scalar.start.column + quote + column - 1)
        return scalar.start


MAX_DEPTH: Final = 64
"""How deeply a policy or test document may nest; real ones nest about six."""


class YAMLSyntaxError(Exception):
    def __init__(self, message: str, position: Position) -> None:
        super().__init__(message)
        self.position = position


def load(text: str) -> Document:
    """Parse one YAML document with positions.

    Raises:
        YAMLSyntaxError: the text is not YAML (with the position of the problem).
    """
    try:
        node = _compose(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        position = Position(mark.line + 1, mark.column + 1) if mark else Position(1, 1)
        raise YAMLSyntaxError(
            f"YAML syntax error: {exc.problem or exc.context}", position
        ) from None
    except yaml.YAMLError as exc:
        raise YAMLSyntaxError(f"YAML syntax error: {exc}", Position(1, 1)) from None
    document = Document(data=None)
    if node is not None:
        too_deep = _deeper_than(node, MAX_DEPTH)
        if too_deep is not None:
            raise YAMLSyntaxError(
                f"the document is nested deeper than {MAX_DEPTH} levels", _position(too_deep)
            )
        constructor = yaml.SafeLoader("")
        try:
            document.data = _convert(node, (), document, text.splitlines(), constructor)
        finally:
            constructor.dispose()
    return document


def _deeper_than(root: yaml.Node, limit: int) -> Any:
    """The start mark of the first node nested deeper than ``limit``, if any
    (walked without recursion, so any depth is safe to ask about)."""
    stack: list[tuple[yaml.Node, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return node.start_mark
        if isinstance(node, yaml.MappingNode):
            stack.extend((value, depth + 1) for _, value in node.value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, depth + 1) for item in node.value)
    return None


def _compose(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=_COMPOSER)
    except yaml.YAMLError as terse:
        # libyaml words its errors tersely: the pure-Python parser, which
        # accepts the same YAML, says what it expected and found instead.
        try:
            return yaml.compose(text, Loader=yaml.SafeLoader)
        except RecursionError:
            # Nesting too deep for a recursive parser: libyaml's word stands.
            raise terse from None


def _position(mark: Any) -> Position:
    return Position(mark.line + 1, mark.column + 1)


def _convert(
    node: yaml.Node, path: Path, document: Document, lines: list[str], loader: yaml.SafeLoader
) -> Any:
    document.positions[path] = _position(node.start_mark)
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = (
                _scalar(key_node, loader)
                if isinstance(key_node, yaml.ScalarNode)
                else "<complex key>"
            )
            child: Path = (*path, key)
            if key in result:
                document.duplicates.append((child, _position(key_node.start_mark)))
            else:
                document.keys[child] = _position(key_node.start_mark)
            result[key] = _convert(value_node, child, document, lines, loader)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [
            _convert(item, (*path, i), document, lines, loader) for i, item in enumerate(node.value)
        ]
    assert isinstance(node, yaml.ScalarNode)
    document.scalars[path] = Scalar(
        style=node.style,
        start=_position(node.start_mark),
        end_line=node.end_mark.line + 1,
        content_indent=_block_indent(lines, node.start_mark.line + 1)
        if node.style in ("|", ">")
        else 0,
    )
    return _scalar(node, loader)


def _block_indent(lines: list[str], first: int) -> int:
    """The column where a block scalar's content starts (its first non-blank line)."""
    for line in lines[first:]:
        if line.strip():
            return len(line) - len(line.lstrip(" ")) + 1
    return 1


_STR: Final = "tag:yaml.org,2002:str"


def _scalar(node: yaml.ScalarNode, loader: yaml.SafeLoader) -> Any:
    if node.tag == _STR:  # most of a policy file: its text is its value
        return node.value
    return loader.construct_object(node)
