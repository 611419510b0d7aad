"""TaperNorm in JAX/Flax: gated normalization removal and scale anchoring."""

from tapernorm_jax import allocator as _allocator

_allocator.keep_freed_memory()  # before jax is imported: XLA:CPU's step buffers reused, not re-faulted (allocator.py)

__version__ = "0.1.0"
