"""The model's seams: every linear map goes through a `Projection` (default `einsum`) and causal attention may go
through an `Attend`, so a backend's own product or attention (`tapernorm_jax/cpu_kernels/`) is chosen by the caller,
never by a backend check inside the model."""

from typing import Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


class Projection(Protocol):
  """The seam every linear map of the model goes through (`Transformer(cfg, projection=...)`).

  Called as `projection(module, name, spec, x_BxTx___, w, part)`: `module` owns the weight `name` (a
  `param_paths` name), `spec` is the einsum that contracts x's trailing axes with w's leading ones,
  and `part` is None or, for the fused QKV weight, the slice of its second axis that `w` is. The
  model's own is `einsum`; decoding may pass another that computes the same product faster on one
  backend (`tapernorm_jax/cpu_kernels/`), reading any extra variables it needs from
  `module`.
  """

  def __call__(
    self, module: nn.Module, name: str, spec: str, x_BxTx___: Array, w: Array, part: slice | None = None
  ) -> Array: ...


class Attend(Protocol):
  """The seam for a backend's own causal attention (`Transformer(cfg, attend=...)`; None: `attention_impl`'s).

  Called as `attend(q, k, v)` on B×T×H×K queries, keys and values (queries not yet scaled) wherever the
  model attends causally within a chunk; it must compute what `attention.causal_attention` does, gradients
  included. The model never picks one itself: a trainer passes the one `tapernorm_jax/cpu_kernels/` selects.
  """

  def __call__(self, q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxK: Array) -> Array: ...


def einsum(module: nn.Module, name: str, spec: str, x_BxTx___: Array, w: Array, part: slice | None = None) -> Array:
  """The model's projection: `jnp.einsum(spec, x, w)`, whatever the backend."""
  del module, name, part
  return jnp.einsum(spec, x_BxTx___, w)
