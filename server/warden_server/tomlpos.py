"""Where each key of a TOML document is written, so that a problem with a
setting is reported as ``file:line``.

``tomllib`` parses without positions. This reads the lines of a document
that has already parsed, follows its table headers (``[a.b]``, and
``[[a.b]]`` counted from 0), and keeps the line of each header and of each
key. A key inside an inline table or a multi-line value is found by the key
that holds it (``line_of`` walks up the path).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

Path = tuple[str | int, ...]

_QUOTES: Final = ('"', "'")


def key_lines(text: str) -> dict[Path, int]:
    """The 1-based line of every table header and key of ``text`` (valid TOML)."""
    lines: dict[Path, int] = {}
    table: Path = ()
    tables_in_array: dict[Path, int] = {}
    open_string: str | None = None  # the delimiter of a multi-line string being read
    depth = 0  # brackets and braces a multi-line value has left open
    for number, raw in enumerate(text.splitlines(), start=1):
        if open_string is not None:
            if open_string in raw:
                open_string = None
            continue
        if depth > 0:
            depth += _balance(raw)
            continue
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[["):
            name = _dotted(_until(line[2:], "]"))
            index = tables_in_array.get(name, -1) + 1
            tables_in_array[name] = index
            table = (*name, index)
            lines.setdefault(name, number)
            lines.setdefault(table, number)
            continue
        if line.startswith("["):
            table = _dotted(_until(line[1:], "]"))
            lines.setdefault(table, number)
            continue
        key = _until(line, "=")
        if key == line:
            continue
        lines.setdefault((*table, *_dotted(key)), number)
        value = line[len(key) + 1 :].strip()
        opener = next((q * 3 for q in _QUOTES if value.startswith(q * 3)), None)
        if opener is not None and opener not in value[3:]:
            open_string = opener
        else:
            depth = _balance(value)
    return lines


def line_of(lines: Mapping[Path, int], path: Path) -> int | None:
    """The line of ``path``, or of the nearest table or key that holds it."""
    for end in range(len(path), 0, -1):
        found = lines.get(path[:end])
        if found is not None:
            return found
    return None


def _outside_strings(text: str) -> Iterator[tuple[int, str]]:
    """Each character of ``text`` that is not inside a quoted string, with its index."""
    quote: str | None = None
    escaped = False
    for index, char in enumerate(text):
        if quote is None:
            if char in _QUOTES:
                quote = char
            else:
                yield index, char
        elif escaped:
            escaped = False
        elif char == "\\" and quote == '"':
            escaped = True
        elif char == quote:
            quote = None


def _until(text: str, stop: str) -> str:
    """``text`` up to the first ``stop`` outside quotes (all of it if none)."""
    for index, char in _outside_strings(text):
        if char == stop:
            return text[:index]
    return text


def _dotted(key: str) -> tuple[str, ...]:
    """The parts of a (possibly dotted, possibly quoted) key."""
    parts: list[str] = []
    rest = key.strip()
    while rest:
        part = _until(rest, ".")
        rest = rest[len(part) + 1 :].strip()
        part = part.strip()
        if len(part) >= 2 and part[0] == part[-1] and part[0] in _QUOTES:
            part = part[1:-1]
        parts.append(part)
    return tuple(parts)


def _balance(text: str) -> int:
    """Brackets and braces opened minus closed, outside strings and comments."""
    balance = 0
    for _, char in _outside_strings(text):
        if char == "#":
            break
        if char in "[{":
            balance += 1
        elif char in "]}":
            balance -= 1
    return balance
