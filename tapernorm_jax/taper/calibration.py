"""Calibration of TaperNorm: EMA statistics, c* = num/(den + δ), γ̃ ← γ and s_tgt, as pure functions (docs/method.md §3).

The `calib` collection holds, per tapered norm, `num`, `den`, `s`, `count` and `c`, and at the
model level (`pre_logit`) `s`, `count` and `s_tgt` (paths: `param_paths.py`). A forward pass with
`calib_stats` mutable returns this step's batch statistics under the same paths; `ema_update`
folds them in. Every function here maps plain (unboxed) pytrees to new pytrees.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

from tapernorm_jax.model import param_paths

PyTree = Any


def ema_update(
  calib: PyTree, stats: PyTree, mu: float, active: jax.Array | bool | Mapping[param_paths.Path, jax.Array] = True
) -> PyTree:
  """EMA step `v ← v + μ(x − v)` for every recorded statistic, `count += 1`; a layer whose `active` (one flag, or
  one per layer path) is false keeps its values."""
  flat_calib = traverse_util.flatten_dict(calib)
  flat_stats = traverse_util.flatten_dict(stats)
  new = dict(flat_calib)
  for key, x in flat_stats.items():
    if key not in flat_calib:
      raise KeyError(f"statistic {'/'.join(key)} has no calibration entry; the model and its calib state differ")
    new[key] = flat_calib[key] + mu * (x - flat_calib[key])
  for node in {key[:-1] for key in flat_stats}:
    new[node + (param_paths.COUNT,)] = flat_calib[node + (param_paths.COUNT,)] + 1
  flag = active.get if isinstance(active, Mapping) else (lambda node, default=None: active)
  new = {k: jnp.where(flag(k[:-1], True), v, flat_calib[k]) for k, v in new.items()}
  return traverse_util.unflatten_dict(new)


def debiased(value: jax.Array, count: jax.Array, mu: float) -> jax.Array:
  """Bias-corrected EMA after `count` updates from a zero start: value / (1 − (1 − μ)^count)."""
  correction = 1.0 - jnp.power(1.0 - mu, count.astype(jnp.float32))
  return jnp.where(count > 0, value / jnp.where(count > 0, correction, 1.0), 0.0)


def calibrate(
  params: PyTree, calib: PyTree, norms: Sequence[param_paths.Path], mu: float, delta: float
) -> tuple[PyTree, PyTree]:
  """The taper start: `calibrate_norms` and `freeze_scale_target` on a whole model; returns (params, calib)."""
  params, calib = calibrate_norms(params, calib, norms, mu, delta)
  return params, freeze_scale_target(calib, mu)


def calibrate_norms(
  params: PyTree, calib: PyTree, norms: Sequence[param_paths.Path], mu: float, delta: float
) -> tuple[PyTree, PyTree]:
  """Sets c* = num/(den + δ) from the debiased EMAs and γ̃ ← γ in each norm of `norms`; returns (params, calib)."""
  flat_params = traverse_util.flatten_dict(params)
  flat_calib = dict(traverse_util.flatten_dict(calib))
  for norm in norms:
    count = flat_calib[norm + (param_paths.COUNT,)]
    num = debiased(flat_calib[norm + (param_paths.NUM,)], count, mu)
    den = debiased(flat_calib[norm + (param_paths.DEN,)], count, mu)
    flat_calib[norm + (param_paths.C,)] = num / (den + delta)
    flat_params[norm + (param_paths.GAMMA_TILDE,)] = flat_params[norm + (param_paths.GAMMA,)]
  return traverse_util.unflatten_dict(flat_params), traverse_util.unflatten_dict(flat_calib)


def fake_ln(params: PyTree, calib: PyTree, norms: Sequence[param_paths.Path], mu: float) -> tuple[PyTree, PyTree]:
  """FakeLN's freeze: c = 1/σ_avg (the debiased EMA of the batch-mean s(h)) and γ̃ ← γ in each norm of `norms`."""
  flat_params = traverse_util.flatten_dict(params)
  flat_calib = dict(traverse_util.flatten_dict(calib))
  for norm in norms:
    s, count = flat_calib[norm + (param_paths.S,)], flat_calib[norm + (param_paths.COUNT,)]
    flat_calib[norm + (param_paths.C,)] = 1.0 / debiased(s, count, mu)
    flat_params[norm + (param_paths.GAMMA_TILDE,)] = flat_params[norm + (param_paths.GAMMA,)]
  return traverse_util.unflatten_dict(flat_params), traverse_util.unflatten_dict(flat_calib)


def freeze_scale_target(calib: PyTree, mu: float) -> PyTree:
  """Sets s_tgt to the debiased EMA of the pre-logit scale s(h)."""
  flat = dict(traverse_util.flatten_dict(calib))
  monitor = (param_paths.PRE_LOGIT,)
  flat[param_paths.S_TGT_PATH] = debiased(flat[monitor + (param_paths.S,)], flat[monitor + (param_paths.COUNT,)], mu)
  return traverse_util.unflatten_dict(flat)


def norm_scalars(calib: PyTree, norms: Sequence[param_paths.Path], name: str) -> dict[str, jax.Array]:
  """The calibration scalar `name` (e.g. `c`) of each norm in `norms`, keyed by its path joined with '/'."""
  flat = traverse_util.flatten_dict(calib)
  return {"/".join(norm): flat[norm + (name,)] for norm in norms}


def s_target(calib: PyTree) -> jax.Array:
  """The frozen pre-logit scale target s_tgt."""
  return traverse_util.flatten_dict(calib)[param_paths.S_TGT_PATH]
