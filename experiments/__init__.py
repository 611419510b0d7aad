"""The entry points (`python -m experiments.NAME`). Importing this package first sets glibc's malloc to keep freed
memory for reuse, before any of them imports jax (tapernorm_jax/allocator.py)."""

from tapernorm_jax import allocator

allocator.keep_freed_memory()
