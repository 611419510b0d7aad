"""Benchmarks as library functions (the `experiments/benchmark_*` entry points and notebooks call them)."""
