"""RMSNorm, LayerNorm and TaperNorm (RMS and LN kinds), with their fixed g = 0 and identity forms (docs/method.md §2).

One module, `Norm`, covers every form so that the forms share parameter and calibration
names: a `taper` layer's variables load unchanged into a `fixed` layer (the g = 0 map) and
fold into the next projection. Statistics are computed in fp32 and the result is cast to
the compute dtype.

    plain     RMSNorm / LayerNorm
    taper     β + g·(h̄/s(h))·γ + (1 − g)·c·h̄·γ̃        (h̄ = h for RMS, h − mean(h) for LN)
    fixed     β + c·h̄·γ̃                                the g = 0 map as an explicit multiply
    identity  h                                       what is left after folding
    dyt       β + γ·tanh(α·h)                         DyT: no statistics, a learned scalar α (Zhu et al., 2025)
    derf      β + γ·erf(α·h + s)                      Derf: the same with erf and a learned shift s (Chen et al.)
    repbn     g·Norm(h) + (1 − g)·RepBN(h)            PRepBN (Guo et al., 2024): RepBN(h) = BN(h) + η·h

β is LN's only (RMS norms have none), as in both point-wise norms' language-model code (DyT's LLaMA has no bias,
Derf's GPT-2 has one). They have no g = 0 map and no fold: a gate leaves them as they are.

RepBN's BatchNorm normalises each feature over every token of the batch in a train step (the `calib_stats`
collection mutable) and keeps running statistics (`mean`, `var`: the method's EMA folds in the batch's mean and
unbiased variance); anywhere else (evaluation, decoding) it uses the running statistics, so it is a per-token affine
map, which folds.

"Tapered" always means a norm in a calibrated form (`taper` or `fixed`); "scale" always means
the per-token scale s(h) = r(h) (RMS) or σ_h (LN), never a parameter.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from tapernorm_jax.model import param_paths

NORM_KINDS = ("rms", "ln")
NORM_MODES = ("plain", "taper", "fixed", "identity", "dyt", "derf", "repbn")
POINTWISE_MODES = ("dyt", "derf")  # no statistics: a bounded point-wise function with a learned input scale
# α's initial value at the attention norms, the MLP norms and the final norm, as the authors set it for language models:
# DyT's smallest LLaMA (7B; jiachenzhu/DyT other_tasks/LLaMA/README.md at aab5dde), and Derf's GPT-2 defaults
# (zlab-princeton/Derf "language model/train_derf.patch" at 8dd9ea3; shift 0). `model.norm_alpha` overrides both.
POINTWISE_ALPHA = {"dyt": (0.8, 0.2, 0.2), "derf": (1.0, 1.0, 1.0)}
RENAMED_MODES = {"scale": "fixed"}  # old name → new name; configs on disk may carry the old one
CALIB = "calib"  # non-trainable calibration state: EMAs, update counts, c, s_tgt
CALIB_STATS = "calib_stats"  # this step's batch statistics, written when the collection is mutable

Array = jax.Array


def stats_dtype(dtype: Any) -> Any:
  """The dtype norm statistics are computed in: float32, or float64 for float64 inputs."""
  return jnp.promote_types(dtype, jnp.float32)


def centered(h_BxTxD: Array, kind: str) -> Array:
  """h for RMS, h − mean(h) for LN (along the feature axis)."""
  return h_BxTxD - jnp.mean(h_BxTxD, axis=-1, keepdims=True) if kind == "ln" else h_BxTxD


def inv_scale(hbar_BxTxD: Array, eps: float) -> Array:
  """1 / sqrt(mean(h̄²) + ε): 1/r(h) for RMS, 1/σ_h for LN (h̄ centered)."""
  return jax.lax.rsqrt(jnp.mean(jnp.square(hbar_BxTxD), axis=-1, keepdims=True) + eps)


def calib_scalar(module: nn.Module, name: str, value: float, dtype: Any = jnp.float32) -> nn.Variable:
  """A scalar in the `calib` collection, initialised to `value`."""
  return module.variable(CALIB, name, lambda: jnp.full((), value, dtype))


class Norm(nn.Module):
  """A pre-norm normalization layer in one of the forms `NORM_MODES` lists (the table above)."""

  kind: str = "rms"
  mode: str = "plain"
  eps: float = 1e-5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  alpha_init: float = 1.0  # dyt and derf: α's initial value
  shift_init: float = 0.0  # derf: s's initial value
  gain_init: float = 1.0  # γ's initial value
  bn_gain_init: float = 0.0  # repbn: BatchNorm's affine weight's initial value

  @nn.compact
  def __call__(
    self, x_BxTxD: Array, gate: Array | float = 1.0, gate_v: Array | None = None
  ) -> Array | tuple[Array, Array]:
    """Normalizes the last axis; `gate` is a traced scalar used by the `taper` and `repbn` forms only. With `gate_v`,
    returns two outputs of the one normalization: blended by `gate` and by `gate_v` (an attention norm's value
    path); forms without a gate give the same output for both."""
    if self.kind not in NORM_KINDS:
      raise ValueError(f"norm kind must be one of {NORM_KINDS}, got {self.kind!r}")
    if self.mode not in NORM_MODES:
      raise ValueError(f"norm mode must be one of {NORM_MODES}, got {self.mode!r}")
    if self.mode == "identity":
      return x_BxTxD if gate_v is None else (x_BxTxD, x_BxTxD)
    x_BxTxD_s = x_BxTxD.astype(stats_dtype(x_BxTxD.dtype))
    gamma_D = self.feature(param_paths.GAMMA, nn.initializers.constant(self.gain_init), x_BxTxD_s)
    beta_D = self.feature(param_paths.BETA, nn.initializers.zeros, x_BxTxD_s) if self.kind == "ln" else 0.0
    if self.mode in ("taper", "fixed"):
      return self.calibrated(centered(x_BxTxD_s, self.kind), gamma_D, beta_D, gate, gate_v)
    if self.mode in POINTWISE_MODES:
      y_BxTxD = self.pointwise(x_BxTxD_s, gamma_D, beta_D)
    else:  # plain, repbn
      hbar_BxTxD = centered(x_BxTxD_s, self.kind)
      y_BxTxD = hbar_BxTxD * inv_scale(hbar_BxTxD, self.eps) * gamma_D + beta_D
      if self.mode == "repbn":
        g = jnp.asarray(gate, y_BxTxD.dtype)
        y_BxTxD = g * y_BxTxD + (1.0 - g) * self.rep_bn(x_BxTxD_s)
    y_BxTxD = y_BxTxD.astype(self.dtype)
    return y_BxTxD if gate_v is None else (y_BxTxD, y_BxTxD)

  def feature(self, name: str, init: Any, x_BxTxD: Array) -> Array:
    """A (D,) parameter `name`, split along the `norm` axis, in the statistics dtype of `x_BxTxD`."""
    return self.param(
      name, nn.with_logical_partitioning(init, ("norm",)), (x_BxTxD.shape[-1],), self.param_dtype
    ).astype(x_BxTxD.dtype)

  def scalar(self, name: str, value: float, dtype: Any) -> Array:
    """A learned scalar parameter `name`, initially `value`, in `dtype`."""
    return self.param(
      name, nn.with_logical_partitioning(nn.initializers.constant(value), ()), (), self.param_dtype
    ).astype(dtype)

  def pointwise(self, x_BxTxD: Array, gamma_D: Array, beta_D: Array | float) -> Array:
    """DyT's γ·tanh(α·h) + β or Derf's γ·erf(α·h + s) + β, in the statistics dtype."""
    z_BxTxD = self.scalar(param_paths.ALPHA, self.alpha_init, x_BxTxD.dtype) * x_BxTxD
    if self.mode == "dyt":
      return jnp.tanh(z_BxTxD) * gamma_D + beta_D
    return (
      jax.scipy.special.erf(z_BxTxD + self.scalar(param_paths.SHIFT, self.shift_init, x_BxTxD.dtype)) * gamma_D + beta_D
    )

  def calibrated(
    self, hbar_BxTxD: Array, gamma_D: Array, beta_D: Array | float, gate: Array | float, gate_v: Array | None
  ) -> Array | tuple[Array, Array]:
    """The `fixed` map β + c·h̄·γ̃, or the `taper` blend β + g·(h̄/s(h))·γ + (1 − g)·c·h̄·γ̃, recording this step's
    calibration statistics where the `calib_stats` collection is mutable."""
    gamma_tilde_D = self.feature(param_paths.GAMMA_TILDE, nn.initializers.ones, hbar_BxTxD)
    c = calib_scalar(self, param_paths.C, 1.0).value
    calib_scalar(self, param_paths.NUM, 0.0)
    calib_scalar(self, param_paths.DEN, 0.0)
    calib_scalar(self, param_paths.S, 0.0)
    calib_scalar(self, param_paths.COUNT, 0, jnp.int32)
    fixed_BxTxD = c * hbar_BxTxD * gamma_tilde_D
    if self.mode == "fixed":
      y_BxTxD = (beta_D + fixed_BxTxD).astype(self.dtype)
      return y_BxTxD if gate_v is None else (y_BxTxD, y_BxTxD)
    inv_s_BxTx1 = inv_scale(hbar_BxTxD, self.eps)
    normed_BxTxD = hbar_BxTxD * inv_s_BxTx1 * gamma_D
    if self.is_mutable_collection(CALIB_STATS) and not self.is_initializing():
      sq_BxT = jnp.sum(jnp.square(jax.lax.stop_gradient(hbar_BxTxD * gamma_D)), axis=-1)
      self.put_variable(CALIB_STATS, param_paths.NUM, jnp.mean(sq_BxT * inv_s_BxTx1[..., 0]))
      self.put_variable(CALIB_STATS, param_paths.DEN, jnp.mean(sq_BxT))
      s_BxT = 1.0 / jax.lax.stop_gradient(inv_s_BxTx1[..., 0])  # σ_avg leaves out position 0 (an attention sink)
      self.put_variable(CALIB_STATS, param_paths.S, jnp.mean(s_BxT[:, 1:] if s_BxT.shape[1] > 1 else s_BxT))
    blend = lambda g: (beta_D + g * normed_BxTxD + (1.0 - g) * fixed_BxTxD).astype(self.dtype)
    g = jnp.asarray(gate, hbar_BxTxD.dtype)
    return blend(g) if gate_v is None else (blend(g), blend(jnp.asarray(gate_v, hbar_BxTxD.dtype)))

  def rep_bn(self, x_BxTxD: Array) -> Array:
    """RepBN(x) = BN(x) + η·x: BatchNorm over every token of the batch in a train step (recording its mean and
    unbiased variance), over the running statistics otherwise; BN's affine map and η start at 0, as in PRepBN
    (BN's weight at `bn_gain_init` where that is set)."""
    bn_gamma_D = self.feature(param_paths.BN_GAMMA, nn.initializers.constant(self.bn_gain_init), x_BxTxD)
    bn_beta_D = self.feature(param_paths.BN_BETA, nn.initializers.zeros, x_BxTxD)
    eta = self.scalar(param_paths.ETA, 0.0, x_BxTxD.dtype)
    D = x_BxTxD.shape[-1]
    mean_D = self.variable(CALIB, param_paths.MEAN, lambda: jnp.zeros((D,), jnp.float32)).value.astype(x_BxTxD.dtype)
    var_D = self.variable(CALIB, param_paths.VAR, lambda: jnp.ones((D,), jnp.float32)).value.astype(x_BxTxD.dtype)
    calib_scalar(self, param_paths.COUNT, 0, jnp.int32)
    if self.is_mutable_collection(CALIB_STATS) and not self.is_initializing():
      mean_D = jnp.mean(x_BxTxD, axis=(0, 1))
      var_D = jnp.mean(jnp.square(x_BxTxD - mean_D), axis=(0, 1))  # biased: what the batch is normalised with
      n = x_BxTxD.shape[0] * x_BxTxD.shape[1]
      self.put_variable(CALIB_STATS, param_paths.MEAN, jax.lax.stop_gradient(mean_D).astype(jnp.float32))
      self.put_variable(
        CALIB_STATS, param_paths.VAR, jax.lax.stop_gradient(var_D * n / max(n - 1, 1)).astype(jnp.float32)
      )
    bn_BxTxD = (x_BxTxD - mean_D) * jax.lax.rsqrt(var_D + self.eps) * bn_gamma_D + bn_beta_D
    return bn_BxTxD + eta * x_BxTxD


class ScaleMonitor(nn.Module):
  """Holds the EMA of the batch-mean pre-logit scale s(h) and the frozen target s_tgt."""

  kind: str = "rms"
  eps: float = 1e-5

  @nn.compact
  def __call__(self, h_BxTxD: Array) -> Array:
    """Returns s(h) per token (r(h) for RMS, σ_h for LN); records its batch mean when asked."""
    calib_scalar(self, param_paths.S, 0.0)
    calib_scalar(self, param_paths.COUNT, 0, jnp.int32)
    calib_scalar(self, param_paths.S_TGT, 0.0)
    s_BxT = pre_logit_scale(h_BxTxD, self.kind, self.eps)
    if self.is_mutable_collection(CALIB_STATS) and not self.is_initializing():
      self.put_variable(CALIB_STATS, param_paths.S, jnp.mean(jax.lax.stop_gradient(s_BxT)))
    return s_BxT


def pre_logit_scale(h_BxTxD: Array, kind: str, eps: float) -> Array:
  """s(h) per token: r(h) for RMS models, σ_h for LN models, in fp32 (fp64 for fp64 inputs)."""
  hbar_BxTxD = centered(h_BxTxD.astype(stats_dtype(h_BxTxD.dtype)), kind)
  return jnp.sqrt(jnp.mean(jnp.square(hbar_BxTxD), axis=-1) + eps)
