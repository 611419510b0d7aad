"""The entry points (`python -m experiments.NAME`). Importing this package first sets glibc's malloc to keep freed
memory for reuse (tapernorm_jax/runtime/allocator.py) and, on a host without a TPU, keeps jax from starting libtpu
(tapernorm_jax/runtime/platforms.py), before any of them imports jax."""

from tapernorm_jax.runtime import allocator, platforms

allocator.keep_freed_memory()
platforms.without_absent_tpu()
