"""Capability globs: which ids a rule's glob can match, and an index from a
capability id to the rules whose globs match it.

Globs are ``fnmatch`` patterns without brackets: ``*`` matches any run of
characters (dots included) and ``?`` any one character.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from typing import Final

CAPABILITY_ID: Final = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
"""A capability id: ``namespace.name``, lowercase, dot separated (SPEC §5)."""

WILDCARDS: Final = frozenset("*?")
_GLOB_CHARS: Final = re.compile(r"^[a-z0-9_.*?]+$")

# A capability id, as a deterministic automaton over four character classes.
# States: 0 start, 1 in the first segment, 2 just after a dot, 3 in a later
# segment (accepting).
_LETTER, _DIGIT, _UNDERSCORE, _DOT = "a", "0", "_", "."
_CLASSES: Final = (_LETTER, _DIGIT, _UNDERSCORE, _DOT)
_ID_STEP: Final[dict[tuple[int, str], int]] = {
    (0, _LETTER): 1,
    (1, _LETTER): 1,
    (1, _DIGIT): 1,
    (1, _UNDERSCORE): 1,
    (1, _DOT): 2,
    (2, _LETTER): 3,
    (3, _LETTER): 3,
    (3, _DIGIT): 3,
    (3, _UNDERSCORE): 3,
    (3, _DOT): 2,
}
_ID_ACCEPTS: Final = 3


def _class_of(char: str) -> str | None:
    if "a" <= char <= "z":
        return _LETTER
    if char.isdigit():
        return _DIGIT
    if char == "_":
        return _UNDERSCORE
    if char == ".":
        return _DOT
    return None


def can_match_an_id(glob: str) -> bool:
    """Whether some valid capability id matches ``glob``.

    Decided exactly by walking the glob and the id automaton together, so
    ``Orders.*``, ``orders`` and ``orders..get`` are caught while ``*`` and
    ``orders.*`` pass.
    """
    if not _GLOB_CHARS.match(glob):
        return False
    if WILDCARDS.isdisjoint(glob):  # most globs are an id: it is one or not
        return CAPABILITY_ID.fullmatch(glob) is not None
    # Reachable (position in glob, id state) pairs.
    seen: set[tuple[int, int]] = set()
    stack = [(0, 0)]
    while stack:
        position, state = stack.pop()
        if (position, state) in seen:
            continue
        seen.add((position, state))
        if position == len(glob):
            if state == _ID_ACCEPTS:
                return True
            continue
        char = glob[position]
        if char == "*":
            stack.append((position + 1, state))  # the star matches nothing more
            for cls in _CLASSES:  # or one more character, staying on the star
                if (step := _ID_STEP.get((state, cls))) is not None:
                    stack.append((position, step))
        elif char == "?":
            for cls in _CLASSES:
                if (step := _ID_STEP.get((state, cls))) is not None:
                    stack.append((position + 1, step))
        elif (literal := _class_of(char)) is not None and (
            step := _ID_STEP.get((state, literal))
        ) is not None:
            stack.append((position + 1, step))
    return False


def matches(capability_id: str, glob: str) -> bool:
    """Whether ``capability_id`` matches ``glob``.

    The globs policies mostly use, a literal id and ``prefix*``, are compared
    as text: ``fnmatch`` compiles each distinct glob to a regular expression,
    and a set of thousands of rules would spend a quarter of a second of every
    load compiling them."""
    star = glob.find("*")
    if star < 0 and "?" not in glob:
        return capability_id == glob
    if star == len(glob) - 1 and "?" not in glob:
        return capability_id.startswith(glob[:-1])
    return fnmatch.fnmatchcase(capability_id, glob)


class GlobIndex:
    """Which items' globs match a capability id, without trying every glob.

    Items are bucketed by their globs' literal first segment (``orders.*``
    under ``orders``); only globs that begin with a wildcard are tried for
    every id. Answers keep the items' original order and are memoized per
    id, since the ids asked about are the registered capabilities.
    """

    _MEMO_LIMIT: Final = 10_000

    def __init__(self, globs_per_item: Iterable[Iterable[str]]) -> None:
        self._globs: list[tuple[str, ...]] = [tuple(globs) for globs in globs_per_item]
        self._exact: dict[str, set[int]] = {}
        self._by_namespace: dict[str, set[int]] = {}
        self._anywhere: set[int] = set()
        for position, globs in enumerate(self._globs):
            for glob in globs:
                head = glob.split(".", 1)[0]
                if not WILDCARDS & set(glob):
                    self._exact.setdefault(glob, set()).add(position)
                elif WILDCARDS & set(head):
                    self._anywhere.add(position)
                else:
                    self._by_namespace.setdefault(head, set()).add(position)
        self._memo: dict[str, tuple[int, ...]] = {}

    def positions(self, capability_id: str) -> tuple[int, ...]:
        """The positions of the items with a glob matching ``capability_id``, in order."""
        found = self._memo.get(capability_id)
        if found is None:
            candidates = (
                self._exact.get(capability_id, set())
                | self._by_namespace.get(capability_id.split(".", 1)[0], set())
                | self._anywhere
            )
            found = tuple(
                p
                for p in sorted(candidates)
                if any(matches(capability_id, g) for g in self._globs[p])
            )
            if len(self._memo) >= self._MEMO_LIMIT:
                # A replacement dict, not clear(): readers on other threads
                # keep a consistent view without a lock.
                self._memo = {}
            self._memo[capability_id] = found
        return found
