"""Every benchmark runs in quick mode, so that ``make bench`` cannot rot
unseen: a benchmark added to ``benchmarks/`` is picked up here by itself."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import benchmarks

NAMES = sorted(
    m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.startswith("bench_")
)


@pytest.mark.parametrize("name", NAMES)
def test_quick_run_succeeds(name: str) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    assert module.run(quick=True) is True
