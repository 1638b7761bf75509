"""Warden against Cerbos and a bare gRPC echo under the same load.

The benchmark lives in ``benchmarks/peers``; ``python -m benchmarks.peers``
runs it alone with its options.
"""

from __future__ import annotations


def run(quick: bool = False) -> bool:
    from benchmarks.peers import run as run_peers

    return run_peers(quick)
