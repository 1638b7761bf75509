"""Run every benchmark; exit non-zero when a target is missed."""

from __future__ import annotations

import argparse
import sys

from benchmarks import audit_store


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--records",
        type=int,
        default=audit_store.RECORDS,
        help="Audit records to insert before timing queries (default: %(default)s).",
    )
    args = parser.parse_args()
    results = audit_store.run(records=args.records)
    missed = [r for r in results if not r.ok]
    print()
    print(f"{len(results) - len(missed)} passed, {len(missed)} failed")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
