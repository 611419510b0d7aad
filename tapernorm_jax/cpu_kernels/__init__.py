"""Opt-in CPU kernels, selected here and applied through the model's seams; nothing in the model imports them.

    few_rows.prepare(variables, cfg, rows)   decoding a few rows: variables and a projection (`projection=`)
    for_training(cfg)                        training: (projection, attend) for `Transformer(cfg, ...)`
"""

import jax
import jax.numpy as jnp

from tapernorm_jax.cpu_kernels import attention
from tapernorm_jax.cpu_kernels.projection import matrix_product
from tapernorm_jax.model import ModelConfig
from tapernorm_jax.model.transformer import Attend, Projection, einsum


def for_training(cfg: ModelConfig) -> tuple[Projection, Attend | None]:
  """The projection and attention a train step on this backend passes to `Transformer(cfg, projection=...,
  attend=...)`: on CPU every product as one matrix product with its backward written out (`projection.py`) and
  `attention_for(cfg)`; elsewhere the model's own (einsum, None)."""
  if jax.default_backend() != "cpu":
    return einsum, None
  return matrix_product, attention_for(cfg)


def attention_for(cfg: ModelConfig) -> Attend | None:
  """The fused CPU attention (`attention.py`) where `model.attention_impl` is auto, the backend is CPU, activations
  are float32 and the kernels build; otherwise None, and the model attends through `attention_impl`."""
  usable = cfg.attention_impl in (None, "auto") and jnp.dtype(cfg.compute_dtype) == jnp.float32
  return attention.causal_attention if usable and attention.available() else None  # available: CPU only
