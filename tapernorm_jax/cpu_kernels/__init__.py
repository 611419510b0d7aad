"""Opt-in CPU kernels, offered here as candidates, chosen by timing on the host (`autotune`), applied through the
model's seams; nothing in the model imports them.

    few_rows.prepare(variables, cfg, rows)   decoding a few rows: variables and a projection (`projection=`)
    training_paths(cfg, mesh)                training: name → (projection, attend) for `Transformer(cfg, ...)`

Both offer candidates only for the model's *target* platform (`ModelConfig.target_platform`, set from the mesh),
never the host's backend: a program compiled for a TPU or GPU mesh gets none of them, whatever machine builds it.
Which candidate a run uses is measured (`autotune.choose`, once per host and shape) unless a config field forces one.
"""

import functools

import jax.numpy as jnp
from jax.sharding import Mesh

from tapernorm_jax.cpu_kernels import attention
from tapernorm_jax.cpu_kernels.autotune import KERNELS, XLA
from tapernorm_jax.cpu_kernels.projection import matrix_product
from tapernorm_jax.model import ModelConfig, sharding
from tapernorm_jax.model import attention as model_attention
from tapernorm_jax.model.seams import Attend, Projection, einsum

TRAINING_PATHS = (XLA, KERNELS, "kernel_products", "kernel_attention", "xla_dense_attention")


def training_paths(cfg: ModelConfig, mesh: Mesh | None = None) -> dict[str, tuple[Projection, Attend | None]]:
  """The (projection, attend) pairs a train step for `cfg`'s target can use, by name: `xla` (the model's einsum and
  `attention_impl`) always; for a CPU target also `kernels`: every product as one matrix product with its backward
  written out (`projection.py`) and the fused attention where it applies (`attention_for`), and then each of the two
  alone (`kernel_products`, `kernel_attention`); `xla_dense_attention` (XLA's T×T attention instead of `blocked`)
  where attention_impl is auto."""
  paths: dict[str, tuple[Projection, Attend | None]] = {XLA: (einsum, None)}
  if cfg.target_platform != "cpu":
    return paths
  fused = attention_for(cfg, mesh)
  paths[KERNELS] = (matrix_product, fused)
  if fused is not None:
    paths["kernel_products"] = (matrix_product, None)
    paths["kernel_attention"] = (einsum, fused)
  if cfg.attention_impl == "auto" and model_attention.resolve("auto", cfg.compute_dtype, cfg.T, "cpu") != "xla":
    paths["xla_dense_attention"] = (
      einsum,
      functools.partial(model_attention.causal_attention, impl="xla", platform=cfg.target_platform, mesh=mesh),
    )
  return paths


def attention_for(cfg: ModelConfig, mesh: Mesh | None = None) -> Attend | None:
  """The fused CPU attention (`attention.py`) where `model.attention_impl` is auto, the target is a CPU, activations
  are float32 and the kernels build, run on each device's own rows of `mesh`; otherwise None, and the model attends
  through `attention_impl`."""
  usable = (
    cfg.attention_impl in (None, "auto")
    and cfg.target_platform == "cpu"
    and jnp.dtype(cfg.compute_dtype) == jnp.float32
  )
  if not (usable and attention.available()):
    return None
  return sharding.per_device(attention.causal_attention, mesh)  # XLA cannot split the custom call over the mesh
