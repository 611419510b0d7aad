"""Decoding a few rows on CPU, faster than XLA:CPU's products, through the model's projection seam (opt-in).

XLA:CPU hands a product of 2–8 rows with a large weight to a GEMM that first copies the weight into
packed panels (about 3.5× the time of one row's matrix–vector product on the machines measured),
so batched decode pays that copy for every weight at every step. Two projections avoid it:

* `kernel_projection`: up to `matvec.MAX_ROWS` rows through the `matvec.rows` custom call, which
  reads each weight row once for all of them. It needs every weight as output × input; `prepare`
  adds those copies once, as the `matvec` variable collection (a second copy of the weights).
* `rowwise_projection`: where the kernel is unavailable (no C++ compiler, `TAPERNORM_MATVEC=0`,
  not float32), one product per row, each reading the weight straight (from cache after the first
  row); an optimisation barrier keeps XLA's dot merger from fusing the rows back into one GEMM.

    variables, projection = few_rows.prepare(variables, cfg, rows=B)
    decode.generate(variables, cfg, ..., projection=projection)

Off CPU, or for more rows, `prepare` returns the variables unchanged and the model's own projection. On CPU it
times the candidates (`decode_paths`: XLA's einsum, the kernel or row by row) once per host and shape
(`autotune.choose`) unless `cpu_paths` forces one.
"""

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from tapernorm_jax.cpu_kernels import autotune, matvec
from tapernorm_jax.cpu_kernels.autotune import KERNELS, XLA
from tapernorm_jax.model import ModelConfig, param_paths
from tapernorm_jax.model.seams import Projection, einsum

Array = jax.Array
PyTree = Any
MATVEC = "matvec"  # variable collection: output×input copies of the projections
ROWWISE_MAX = 8  # 2…ROWWISE_MAX rows (B·T) go one at a time without the kernel
# Leading (input) axes of each projection's weight; its output×input copy is the weight reshaped to 2-D, transposed.
INPUT_AXES = {
  param_paths.QKV: 1,
  param_paths.ATTN_OUT: 2,
  param_paths.WI_GATE: 1,
  param_paths.WI_UP: 1,
  param_paths.WI: 1,
  param_paths.WO: 1,
  param_paths.HEAD: 1,
}


def projection_for(cfg: ModelConfig, rows: int) -> Projection:
  """The projection for decode steps of `rows` rows for `cfg`'s target: the kernel's where it is available
  (float32), else one product per row for a CPU target; for other targets, or past ROWWISE_MAX rows, the model's
  own einsum."""
  if cfg.target_platform != "cpu" or rows > ROWWISE_MAX:
    return einsum
  if matvec.available() and jnp.dtype(cfg.compute_dtype) == jnp.float32 and rows <= matvec.MAX_ROWS:
    return kernel_projection
  return rowwise_projection


def decode_paths(cfg: ModelConfig, rows: int) -> dict[str, Projection]:
  """The projections a decode step of `rows` rows can use, by name: `xla` (the model's einsum) always; where the CPU
  offers more, `kernels` (`projection_for`) and, when that is the kernel, `rowwise` too."""
  kernels = projection_for(cfg, rows)
  if kernels is einsum:
    return {XLA: einsum}
  return {XLA: einsum, KERNELS: kernels, **({"rowwise": rowwise_projection} if kernels is kernel_projection else {})}


def prepare(variables: PyTree, cfg: ModelConfig, rows: int, cpu_paths: str = "auto") -> tuple[PyTree, Projection]:
  """The projection for decode steps of `rows` rows (`cpu_paths`, or timed here: `choose`) with the variables it
  reads: `variables` plus the kernel's weight copies where the kernel runs, `variables` unchanged otherwise."""
  projection = decode_paths(cfg, rows)[choose(variables, cfg, rows, cpu_paths).name]
  return (with_matvec_weights(variables, cfg) if projection is kernel_projection else variables), projection


def choose(variables: PyTree, cfg: ModelConfig, rows: int, cpu_paths: str = "auto") -> autotune.Choice:
  """Which of `decode_paths` runs: `cpu_paths` unless auto, else the fastest at every projection of the model for
  `rows` rows (timed once per host and shape, `autotune.choose`)."""
  candidates = decode_paths(cfg, rows)
  shape = {"model": cfg.program_key(), "rows": rows}
  weights = functools.cache(lambda: with_matvec_weights(variables, cfg))
  builders = {name: (lambda p=p: timed_projections(weights(), p, rows)) for name, p in candidates.items()}
  return autotune.choose(
    "decode_paths", f"D={cfg.D} L={cfg.L} V={cfg.V}, {rows} row(s)", shape, builders, prefer=XLA, forced=cpu_paths
  )


def timed_projections(variables: PyTree, projection: Projection, rows: int) -> autotune.Run:
  """One call of every projection of a decode step (each weight against `rows` rows) through `projection`."""
  w_OxK = [w.reshape(-1, w.shape[-1]) for w in jax.tree.leaves(variables[MATVEC])]
  x_1xRxK = [jnp.ones((1, rows, w.shape[1]), jnp.float32) for w in w_OxK]
  w_KxO = [jnp.asarray(w.T) for w in w_OxK]

  def step(x_1xRxK: list[Array], w_OxK: list[Array], w_KxO: list[Array]) -> list[Array]:
    if projection is kernel_projection:
      return [matvec.rows(x[0], w) for x, w in zip(x_1xRxK, w_OxK)]
    return [projection(None, "", "btk,ko->bto", x, w) for x, w in zip(x_1xRxK, w_KxO)]

  fn = jax.jit(step).lower(x_1xRxK, w_OxK, w_KxO).compile()
  return lambda: jax.block_until_ready(fn(x_1xRxK, w_OxK, w_KxO))


def with_matvec_weights(variables: PyTree, cfg: ModelConfig) -> PyTree:
  """`variables` plus the `matvec` collection: every projection's weight as float32 output × input (QKV as 3 × HK × D,
  so a part of it is a leading slice)."""
  params, copies = nn.meta.unbox(variables["params"]), {}
  for path, w in traverse_util.flatten_dict(params).items():
    if path[-1] in INPUT_AXES:  # made eagerly: made under jit, even outside the decode loop, they slow it ~3×
      w = jnp.asarray(w, jnp.float32)
      w_OxK = w.reshape(math.prod(w.shape[: INPUT_AXES[path[-1]]]), -1).T
      copies[path] = (w_OxK.reshape(3, -1, w.shape[0]) if path[-1] == param_paths.QKV else w_OxK).copy()
  if cfg.tie_embeddings:  # the table already is the tied head's output × input form
    copies[(param_paths.EMBED,)] = jnp.asarray(params[param_paths.EMBED], jnp.float32)
  return {**variables, MATVEC: traverse_util.unflatten_dict(copies)}


def kernel_projection(
  module: nn.Module, name: str, spec: str, x_BxTx___: Array, w: Array, part: slice | None = None
) -> Array:
  """`matvec.rows` against the prepared copy of `name` for up to matvec.MAX_ROWS rows; otherwise row by row."""
  B, T = x_BxTx___.shape[:2]
  if not module.has_variable(MATVEC, name) or B * T > matvec.MAX_ROWS:
    return rowwise_projection(module, name, spec, x_BxTx___, w, part)
  w_OxK = module.get_variable(MATVEC, name)
  if part is not None:
    w_OxK = w_OxK[part].reshape(-1, w_OxK.shape[-1])
  out_RxO = matvec.rows(x_BxTx___.reshape(B * T, w_OxK.shape[1]), w_OxK)
  out_shape = w.shape[:1] if name == param_paths.EMBED else w.shape[x_BxTx___.ndim - 2 :]  # the tied head: V
  return out_RxO.reshape((B, T) + out_shape)


def rowwise_projection(
  module: nn.Module, name: str, spec: str, x_BxTx___: Array, w: Array, part: slice | None = None
) -> Array:
  """`jnp.einsum(spec, x, w)` one row at a time for 2…ROWWISE_MAX rows (B·T); the tied head as one pass over the
  table's rows; one einsum otherwise."""
  del module, part
  B, T = x_BxTx___.shape[:2]
  if not 1 < B * T <= ROWWISE_MAX:
    return jnp.einsum(spec, x_BxTx___, w)
  if name == param_paths.EMBED:  # the product fused into the reduction: each table row is read once
    logits_VxN = jnp.sum(w[:, None, :] * x_BxTx___.reshape(1, B * T, -1), axis=-1)
    return logits_VxN.T.reshape(B, T, -1)
  rows_Nx1x___ = x_BxTx___.reshape((B * T, 1) + x_BxTx___.shape[2:])
  out_Nx1x___ = jnp.concatenate(
    [jnp.einsum(spec, jax.lax.optimization_barrier(rows_Nx1x___[i : i + 1]), w) for i in range(B * T)]
  )
  return out_Nx1x___.reshape((B, T) + out_Nx1x___.shape[2:])
