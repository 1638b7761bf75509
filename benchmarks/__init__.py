"""Benchmarks: each ``bench_*`` module measures a speed target as a ratio
against a baseline measured in the same run, and fails when it misses."""
