"""Run every benchmark (``make bench``); exit 1 if any misses its target."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import benchmarks


def main() -> int:
    missed = 0
    for module in sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__)):
        if module.startswith("bench_"):
            missed += not importlib.import_module(f"benchmarks.{module}").run()
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
