"""Calibration of TaperNorm: EMA statistics, c* = num/(den + δ), γ̃ ← γ and s_tgt, as pure functions.

The `calib` collection holds, per tapered layer, `num`, `den`, `count` and `c`, and at the
model level (`pre_logit`) `s`, `count` and `s_tgt`. A forward pass with `calib_stats`
mutable returns this step's batch statistics under the same paths; `ema_update` folds
them in. Every function here maps plain (unboxed) pytrees to new pytrees.
"""

from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

PyTree = Any


def ema_update(calib: PyTree, stats: PyTree, mu: float, active: jax.Array | bool = True) -> PyTree:
  """EMA step `v ← v + μ(x − v)` for every recorded statistic, `count += 1`; unchanged if not `active`."""
  flat_calib = traverse_util.flatten_dict(calib)
  flat_stats = traverse_util.flatten_dict(stats)
  new = dict(flat_calib)
  for key, x in flat_stats.items():
    if key not in flat_calib:
      raise KeyError(f"statistic {'/'.join(key)} has no calibration entry; the model and its calib state differ")
    new[key] = flat_calib[key] + mu * (x - flat_calib[key])
  for node in {key[:-1] for key in flat_stats}:
    new[node + ("count",)] = flat_calib[node + ("count",)] + 1
  new = {k: jnp.where(active, v, flat_calib[k]) for k, v in new.items()}
  return traverse_util.unflatten_dict(new)


def debiased(value: jax.Array, count: jax.Array, mu: float) -> jax.Array:
  """Bias-corrected EMA after `count` updates from a zero start: value / (1 − (1 − μ)^count)."""
  correction = 1.0 - jnp.power(1.0 - mu, count.astype(jnp.float32))
  return jnp.where(count > 0, value / jnp.where(count > 0, correction, 1.0), 0.0)


def calibrate(params: PyTree, calib: PyTree, mu: float, delta: float) -> tuple[PyTree, PyTree]:
  """Sets c* = num/(den + δ) and γ̃ ← γ in every tapered layer and freezes s_tgt; returns (params, calib)."""
  flat_params = traverse_util.flatten_dict(params)
  flat_calib = dict(traverse_util.flatten_dict(calib))
  nodes = {key[:-1] for key in flat_calib}
  for node in nodes:
    count = flat_calib[node + ("count",)]
    if node + ("c",) in flat_calib:
      num = debiased(flat_calib[node + ("num",)], count, mu)
      den = debiased(flat_calib[node + ("den",)], count, mu)
      flat_calib[node + ("c",)] = num / (den + delta)
      flat_params[node + ("scale_tilde",)] = flat_params[node + ("scale",)]
    if node + ("s_tgt",) in flat_calib:
      flat_calib[node + ("s_tgt",)] = debiased(flat_calib[node + ("s",)], count, mu)
  return traverse_util.unflatten_dict(flat_params), traverse_util.unflatten_dict(flat_calib)


def layer_scalars(calib: PyTree, name: str) -> dict[str, jax.Array]:
  """Every calibration scalar called `name` (e.g. `c`), keyed by its layer path."""
  flat = traverse_util.flatten_dict(calib)
  return {"/".join(key[:-1]): v for key, v in flat.items() if key[-1] == name}


def s_target(calib: PyTree) -> jax.Array:
  """The frozen pre-logit scale target s_tgt."""
  return calib["pre_logit"]["s_tgt"]
