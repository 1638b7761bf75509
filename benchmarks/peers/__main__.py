"""``python -m benchmarks.peers [--quick] [--processes N] [--rounds R] [--duration S]``."""

from __future__ import annotations

import argparse
import sys

from benchmarks.peers import run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="A short smoke run; judges nothing.")
    parser.add_argument(
        "--processes", type=int, help="Server processes for Warden and the echo (default: CPUs)."
    )
    parser.add_argument("--rounds", type=int, help="Interleaved rounds (default 3).")
    parser.add_argument("--duration", type=float, help="Seconds measured per point (default 5).")
    args = parser.parse_args()
    ok = run(args.quick, processes=args.processes, rounds=args.rounds, duration=args.duration)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
