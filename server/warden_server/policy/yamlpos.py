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


@dataclass(slots=True)
class Document:
    """A parsed YAML document: the data and where each part of it stands.

    Where a part stands is kept as the parser marked it (its nodes and
    their marks, which it makes anyway) and turned into a ``Position`` only
    when asked: a large policy set has tens of thousands of nodes, and a
    problem is reported for few of them."""

    data: Any
    lines: list[str] = field(default_factory=list)
    """The text's lines, to find where a block scalar's content starts."""
    marks: dict[Path, Any] = field(default_factory=dict)
    """Each value's start mark (0-based ``line`` and ``column``)."""
    key_marks: dict[Path, Any] = field(default_factory=dict)
    scalars: dict[Path, yaml.ScalarNode] = field(default_factory=dict)
    duplicates: list[tuple[Path, Position]] = field(default_factory=list)

    def position(self, path: Path) -> Position:
        """The position of ``path``'s value, or of its nearest ancestor that exists."""
        while path not in self.marks and path:
            path = path[:-1]
        mark = self.marks.get(path)
        return _position(mark) if mark is not None else Position(1, 1)

    def key_position(self, path: Path) -> Position:
        """The position of the key that names ``path`` (its value's when unknown)."""
        mark = self.key_marks.get(path)
        return _position(mark) if mark is not None else self.position(path)

    def position_in(self, path: Path, line: int, column: int) -> Position:
        """The file position of (``line``, ``column``), 1-based, inside the
        scalar at ``path``: exact for one-line scalars, literal blocks, and
        folded blocks and plain scalars whose lines fold into one; the
        scalar's start where folding makes it ambiguous (blank or
        more-indented lines, quoted scalars over several lines)."""
        scalar = self.scalars.get(path)
        if scalar is None:
            return self.position(path)
        start = _position(scalar.start_mark)
        if scalar.style == "|":
            return Position(start.line + line, _block_indent(self.lines, start.line) + column - 1)
        if scalar.end_mark.line == scalar.start_mark.line and scalar.style != ">":
            quote = 1 if scalar.style in ("'", '"') else 0
            return Position(start.line, start.column + quote + column - 1)
        if line == 1 and scalar.style in (">", "", None):  # "" or None: plain
            places = _folded_places(self.lines, scalar)
            if places is not None and 0 < column <= len(places):
                return places[column - 1]
        return start


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
    document = Document(data=None, lines=text.splitlines())
    if node is not None:
        too_deep = _deeper_than(node, MAX_DEPTH)
        if too_deep is not None:
            raise YAMLSyntaxError(
                f"the document is nested deeper than {MAX_DEPTH} levels", _position(too_deep)
            )
        constructor = yaml.SafeLoader("")
        try:
            document.data = _convert(node, (), document, constructor)
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


def _convert(node: yaml.Node, path: Path, document: Document, loader: yaml.SafeLoader) -> Any:
    document.marks[path] = node.start_mark
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
                document.key_marks[child] = key_node.start_mark
            result[key] = _convert(value_node, child, document, loader)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, (*path, i), document, loader) for i, item in enumerate(node.value)]
    assert isinstance(node, yaml.ScalarNode)
    document.scalars[path] = node
    return _scalar(node, loader)


def _folded_places(lines: list[str], scalar: yaml.ScalarNode) -> list[Position] | None:
    """The position of each character of a scalar whose lines fold into one
    line (a ``>`` block, or a plain scalar over several lines: each line's
    text, joined by single spaces), or None when its value is not that."""
    first, last = scalar.start_mark.line, scalar.end_mark.line
    if scalar.style == ">":
        first += 1  # the line of the indicator holds no content
        if scalar.end_mark.column == 0:
            last -= 1  # the block ends at the start of the next line
    rows = []
    for index in range(first, min(last, len(lines) - 1) + 1):
        text = lines[index]
        begin = scalar.start_mark.column if index == scalar.start_mark.line else 0
        end = scalar.end_mark.column if index == scalar.end_mark.line else len(text)
        content = text[begin:end]
        stripped = content.lstrip(" ")
        begin += len(content) - len(stripped)
        rows.append((index, begin, stripped.rstrip(" ")))
    places: list[Position] = []
    joined: list[str] = []
    for index, begin, text in rows:
        if not text:
            return None  # a blank line folds into a line break
        if joined:
            joined.append(" ")
            places.append(places[-1])
        joined.append(text)
        places.extend(Position(index + 1, begin + 1 + i) for i in range(len(text)))
    if "".join(joined) != scalar.value.rstrip("\n"):
        return None  # more-indented lines, or a comment: folded otherwise
    return places


def _block_indent(lines: list[str], first: int) -> int:
    """The column where a block scalar's content starts (its first non-blank line)."""
    for line in lines[first:]:
        if line.strip():
            return len(line) - len(line.lstrip(" ")) + 1
    return 1


_STR: Final = "tag:yaml.org,2002:str"


def _scalar(node: yaml.ScalarNode, loader: yaml.SafeLoader) -> Any:
    """The value of a scalar.

    Raises:
        YAMLSyntaxError: YAML cannot make a value of it: an unknown tag, or
            text that its form claims for a type it does not fit (an
            impossible date such as 2026-02-30, ``!!int abc``).
    """
    if node.tag == _STR:  # most of a policy file: its text is its value
        return node.value
    try:
        return loader.construct_object(node)
    except yaml.MarkedYAMLError as exc:
        raise YAMLSyntaxError(
            f"YAML: {exc.problem or exc.context}", _position(node.start_mark)
        ) from None
    except (ValueError, OverflowError) as exc:
        kind = node.tag.rpartition(":")[2]
        hint = "; quote dates and times" if kind == "timestamp" else ""
        raise YAMLSyntaxError(
            f"YAML: {node.value!r} does not fit the type YAML reads it as ({kind}: {exc}){hint}",
            _position(node.start_mark),
        ) from None
