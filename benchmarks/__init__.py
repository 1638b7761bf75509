"""Warden's benchmarks: ``make bench`` (``python -m benchmarks``).

Each ``bench_*`` module has a ``run() -> bool`` that measures its speed
targets as ratios against a baseline measured in the same run on the same
machine, so results compare across machines, and returns False when a target
is missed; the run then fails.
"""
