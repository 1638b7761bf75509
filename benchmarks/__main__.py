"""Run every benchmark (``make bench``); exit 1 if any misses its target.

``python -m benchmarks audit`` runs only ``bench_audit``; ``--quick`` runs
tiny sizes in a few seconds each and judges no figure (a smoke run). A module
also runs alone with its own options, e.g. ``python -m benchmarks.bench_audit
--records 100000``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time

import benchmarks

PREFIX = "bench_"


def available() -> list[str]:
    """The names of the benchmark modules, without their ``bench_`` prefix."""
    return sorted(
        m.name.removeprefix(PREFIX)
        for m in pkgutil.iter_modules(benchmarks.__path__)
        if m.name.startswith(PREFIX)
    )


def main() -> int:
    names = available()
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"Benchmarks to run (default: all of {', '.join(names)}).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="Tiny sizes, a few seconds each; checks that each runs, judges no figure.",
    )
    args = parser.parse_args()
    chosen = args.names or names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        parser.error(f"no benchmark named {', '.join(unknown)}; there are {', '.join(names)}")
    print(f"machine: {benchmarks.describe_machine()}\n", flush=True)
    failed = []
    for name in chosen:
        print(f"== {name}{' (quick)' if args.quick else ''}", flush=True)
        started = time.monotonic()
        module = importlib.import_module(f"benchmarks.{PREFIX}{name}")
        if not module.run(quick=args.quick):
            failed.append(name)
        print(f"== {name}: {time.monotonic() - started:.1f}s\n", flush=True)
    if failed:
        print(f"missed a target or failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
