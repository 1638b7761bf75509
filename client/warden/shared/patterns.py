"""Regular expressions from JSON Schemas, run on RE2.

A schema's ``pattern`` and ``patternProperties`` are matched against text a
model wrote. Python's ``re`` backtracks: ``(a+)+$`` against thirty ``a`` and a
``!`` takes minutes, holding the interpreter for every other request. RE2
matches in time linear in the text, whatever the pattern, because it refuses
what needs backtracking (backreferences, lookaround); a schema using those is
refused where it is registered, never run.
"""

from __future__ import annotations

import functools
from typing import Final, Protocol

import re2


class Pattern(Protocol):
    def search(self, text: str) -> object | None: ...


class PatternError(ValueError):
    """RE2 cannot compile a pattern; the message says why."""


_OPTIONS: Final = re2.Options()
_OPTIONS.log_errors = False  # the error is raised; RE2 need not also print it


@functools.lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> Pattern:
    """A compiled RE2 pattern, cached (schemas repeat the same few).

    Raises:
        PatternError: the pattern needs backtracking, or is not a regular
            expression RE2 reads.
    """
    try:
        compiled: Pattern = re2.compile(pattern, options=_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "not a regular expression"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(
            f"pattern {pattern!r} is not supported by RE2, the linear-time engine "
            f"schema patterns run on ({reason}); backreferences and lookaround are not available"
        ) from None
    return compiled


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches anywhere in ``text`` (JSON Schema semantics)."""
    return compile_pattern(pattern).search(text) is not None
