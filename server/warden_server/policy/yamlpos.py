"""YAML with positions: plain data plus the line and column of every node,
so that every problem can be reported as ``file:line:col``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Position:
    line: int
    column: int


@dataclass(slots=True)
class Document:
    """A parsed YAML document: the data and where each part of it stands."""

    data: Any
    positions: dict[Path, Position] = field(default_factory=dict)
    styles: dict[Path, str | None] = field(default_factory=dict)
    duplicates: list[tuple[Path, Position]] = field(default_factory=list)

    def position(self, path: Path) -> Position:
        """The position of ``path``, or of its nearest ancestor that exists."""
        while path not in self.positions and path:
            path = path[:-1]
        return self.positions.get(path, Position(1, 1))


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
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        position = Position(mark.line + 1, mark.column + 1) if mark else Position(1, 1)
        raise YAMLSyntaxError(
            f"YAML syntax error: {exc.problem or exc.context}", position
        ) from None
    document = Document(data=None)
    if node is not None:
        document.data = _convert(node, (), document)
    return document


def _convert(node: yaml.Node, path: Path, document: Document) -> Any:
    document.positions[path] = Position(node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else "<complex key>"
            child: Path = (*path, key)
            if key in result:
                document.duplicates.append(
                    (child, Position(key_node.start_mark.line + 1, key_node.start_mark.column + 1))
                )
            result[key] = _convert(value_node, child, document)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, (*path, i), document) for i, item in enumerate(node.value)]
    assert isinstance(node, yaml.ScalarNode)
    document.styles[path] = node.style
    return _scalar(node)


def _scalar(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node)
    finally:
        loader.dispose()
