"""TaperNorm in JAX/Flax: gated normalization removal and scale anchoring."""

__version__ = "0.1.0"
