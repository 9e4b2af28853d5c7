"""Benchmarks (`make bench`): each `bench_*.py` measures one thing and commits its table to results/."""
