"""The throw-away PostgreSQL server of the tests (``benchmarks/postgres.py``):
one server per test worker, a fresh database per test. ``make test`` installs
Debian's ``postgresql`` package when it is missing and ``CI`` is set; without
binaries the PostgreSQL tests skip, except in CI (``CI=true``), where a
skipped PostgreSQL suite is a failure.
"""

from __future__ import annotations

import os

import pytest

from benchmarks.postgres import Server, binaries

__all__ = ["Server", "binaries", "unavailable"]


def unavailable(reason: str) -> None:
    """Skip a PostgreSQL test, or fail it in CI."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"the PostgreSQL suite cannot run in CI: {reason}")
    pytest.skip(f"PostgreSQL tests need a PostgreSQL server: {reason}")
