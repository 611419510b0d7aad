"""Opt-in CPU kernels, selected here and applied through the model's seams; nothing in the model imports them.

    few_rows.prepare(variables, cfg, rows)   decoding a few rows: variables and a projection (`projection=`)
    for_training(cfg, mesh)                  training: (projection, attend) for `Transformer(cfg, ...)`

Both choose from the model's *target* platform (`ModelConfig.target_platform`, set from the mesh), never the
host's backend: a program compiled for a TPU or GPU mesh gets none of them, whatever machine builds it.
"""

import jax.numpy as jnp
from jax.sharding import Mesh

from tapernorm_jax.cpu_kernels import attention
from tapernorm_jax.cpu_kernels.projection import matrix_product
from tapernorm_jax.model import ModelConfig, sharding
from tapernorm_jax.model.transformer import Attend, Projection, einsum


def for_training(cfg: ModelConfig, mesh: Mesh | None = None) -> tuple[Projection, Attend | None]:
  """The projection and attention a train step for `cfg`'s target passes to `Transformer(cfg, projection=...,
  attend=...)`: for a CPU target every product as one matrix product with its backward written out
  (`projection.py`) and `attention_for(cfg, mesh)`; for any other the model's own (einsum, None)."""
  if cfg.target_platform != "cpu":
    return einsum, None
  return matrix_product, attention_for(cfg, mesh)


def attention_for(cfg: ModelConfig, mesh: Mesh | None = None) -> Attend | None:
  """The fused CPU attention (`attention.py`) where `model.attention_impl` is auto, the target is a CPU, activations
  are float32 and the kernels build, run on each device's own rows of `mesh`; otherwise None, and the model attends
  through `attention_impl`."""
  usable = (cfg.attention_impl in (None, "auto") and cfg.target_platform == "cpu"
            and jnp.dtype(cfg.compute_dtype) == jnp.float32)
  if not (usable and attention.available()):
    return None
  return sharding.per_device(attention.causal_attention, mesh)  # XLA cannot split the custom call over the mesh
