"""Run every benchmark (``make bench``); exit 1 if any misses its target.

``python -m benchmarks audit`` runs only ``bench_audit``; a module also runs
alone with its own options, e.g. ``python -m benchmarks.bench_audit --records
100000``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import benchmarks

PREFIX = "bench_"


def main() -> int:
    available = sorted(
        m.name.removeprefix(PREFIX)
        for m in pkgutil.iter_modules(benchmarks.__path__)
        if m.name.startswith(PREFIX)
    )
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"Benchmarks to run (default: all of {', '.join(available)}).",
    )
    chosen = parser.parse_args().names or available
    unknown = [n for n in chosen if n not in available]
    if unknown:
        parser.error(f"no benchmark named {', '.join(unknown)}; there are {', '.join(available)}")
    missed = 0
    for name in chosen:
        missed += not importlib.import_module(f"benchmarks.{PREFIX}{name}").run()
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
