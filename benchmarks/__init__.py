"""Warden's benchmarks: ``make bench`` (``python -m benchmarks``).

Every figure is printed as a ratio against a baseline measured in the same
run on the same machine, so results compare across machines; each benchmark
has a target ratio and the run fails when one is missed.
"""
