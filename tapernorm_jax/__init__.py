"""TaperNorm in JAX/Flax: gated normalization removal and scale anchoring.

Importing the package changes nothing in the process. A script or notebook that trains on CPU calls
`tapernorm_jax.runtime.allocator.keep_freed_memory()` before it imports jax, as every entry point does
(docs/library.md).
"""

__version__ = "0.1.0"
