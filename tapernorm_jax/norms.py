"""RMSNorm, LayerNorm and TaperNorm (RMS and LN kinds), with their fixed g = 0 and identity forms.

One module, `Norm`, covers every form so that the forms share parameter and calibration
names: a `taper` layer's variables load unchanged into a `scale` layer (the g = 0 map) and
fold into the next projection. Statistics are computed in fp32 and the result is cast to
the compute dtype.

    plain     RMSNorm / LayerNorm
    taper     β + g·(h̄/s(h))·γ + (1 − g)·c·h̄·γ̃        (h̄ = h for RMS, h − mean(h) for LN)
    scale     β + c·h̄·γ̃                                the g = 0 map as an explicit multiply
    identity  h                                       what is left after folding
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

NORM_KINDS = ("rms", "ln")
NORM_MODES = ("plain", "taper", "scale", "identity")
CALIB = "calib"  # non-trainable calibration state: EMAs, update counts, c, s_tgt
CALIB_STATS = "calib_stats"  # this step's batch statistics, written when the collection is mutable

Array = jax.Array


def stats_dtype(dtype: Any) -> Any:
  """The dtype norm statistics are computed in: float32, or float64 for float64 inputs."""
  return jnp.promote_types(dtype, jnp.float32)


def centered(h_NxD: Array, kind: str) -> Array:
  """h for RMS, h − mean(h) for LN (along the feature axis)."""
  return h_NxD - jnp.mean(h_NxD, axis=-1, keepdims=True) if kind == "ln" else h_NxD


def inv_scale(hbar_NxD: Array, eps: float) -> Array:
  """1 / sqrt(mean(h̄²) + ε): 1/r(h) for RMS, 1/σ_h for LN (h̄ centered)."""
  return jax.lax.rsqrt(jnp.mean(jnp.square(hbar_NxD), axis=-1, keepdims=True) + eps)


def calib_scalar(module: nn.Module, name: str, value: float, dtype: Any = jnp.float32) -> nn.Variable:
  """A scalar in the `calib` collection, initialised to `value`."""
  return module.variable(CALIB, name, lambda: jnp.full((), value, dtype))


class Norm(nn.Module):
  """A pre-norm normalization layer in one of the forms `plain`, `taper`, `scale`, `identity`."""

  kind: str = "rms"
  mode: str = "plain"
  eps: float = 1e-5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxLxD: Array, gate: Array | float = 1.0) -> Array:
    """Normalizes the last axis; `gate` is a traced scalar used by the `taper` form only."""
    if self.kind not in NORM_KINDS:
      raise ValueError(f"norm kind must be one of {NORM_KINDS}, got {self.kind!r}")
    if self.mode not in NORM_MODES:
      raise ValueError(f"norm mode must be one of {NORM_MODES}, got {self.mode!r}")
    if self.mode == "identity":
      return x_BxLxD
    D, sdt = x_BxLxD.shape[-1], stats_dtype(x_BxLxD.dtype)
    feature_param = lambda name, init: self.param(
        name, nn.with_logical_partitioning(init, ("norm",)), (D,), self.param_dtype
    ).astype(sdt)
    gamma_D = feature_param("scale", nn.initializers.ones)
    beta_D = feature_param("bias", nn.initializers.zeros) if self.kind == "ln" else 0.0
    hbar_BxLxD = centered(x_BxLxD.astype(sdt), self.kind)
    if self.mode == "plain":
      return (hbar_BxLxD * inv_scale(hbar_BxLxD, self.eps) * gamma_D + beta_D).astype(self.dtype)

    gamma_tilde_D = feature_param("scale_tilde", nn.initializers.ones)
    c = calib_scalar(self, "c", 1.0).value
    calib_scalar(self, "num", 0.0)
    calib_scalar(self, "den", 0.0)
    calib_scalar(self, "count", 0, jnp.int32)
    fixed_BxLxD = c * hbar_BxLxD * gamma_tilde_D
    if self.mode == "scale":
      return (beta_D + fixed_BxLxD).astype(self.dtype)

    inv_s_BxLx1 = inv_scale(hbar_BxLxD, self.eps)
    normed_BxLxD = hbar_BxLxD * inv_s_BxLx1 * gamma_D
    if self.is_mutable_collection(CALIB_STATS) and not self.is_initializing():
      sq_BxL = jnp.sum(jnp.square(jax.lax.stop_gradient(hbar_BxLxD * gamma_D)), axis=-1)
      self.put_variable(CALIB_STATS, "num", jnp.mean(sq_BxL * inv_s_BxLx1[..., 0]))
      self.put_variable(CALIB_STATS, "den", jnp.mean(sq_BxL))
    gate = jnp.asarray(gate, sdt)
    return (beta_D + gate * normed_BxLxD + (1.0 - gate) * fixed_BxLxD).astype(self.dtype)


class ScaleMonitor(nn.Module):
  """Holds the EMA of the batch-mean pre-logit scale s(h) and the frozen target s_tgt."""

  kind: str = "rms"
  eps: float = 1e-5

  @nn.compact
  def __call__(self, h_BxLxD: Array) -> Array:
    """Returns s(h) per token (r(h) for RMS, σ_h for LN); records its batch mean when asked."""
    calib_scalar(self, "s", 0.0)
    calib_scalar(self, "count", 0, jnp.int32)
    calib_scalar(self, "s_tgt", 0.0)
    s_BxL = pre_logit_scale(h_BxLxD, self.kind, self.eps)
    if self.is_mutable_collection(CALIB_STATS) and not self.is_initializing():
      self.put_variable(CALIB_STATS, "s", jnp.mean(jax.lax.stop_gradient(s_BxL)))
    return s_BxL


def pre_logit_scale(h_BxLxD: Array, kind: str, eps: float) -> Array:
  """s(h) per token: r(h) for RMS models, σ_h for LN models, in fp32 (fp64 for fp64 inputs)."""
  hbar = centered(h_BxLxD.astype(stats_dtype(h_BxLxD.dtype)), kind)
  return jnp.sqrt(jnp.mean(jnp.square(hbar), axis=-1) + eps)
