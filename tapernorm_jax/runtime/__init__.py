"""The host runtime: which jax platforms start, the CPU and its peak rates, glibc malloc's settings, and jax's
persistent compilation cache."""
