"""Calibration: c* is the least-squares minimiser, the debiased EMA is unbiased, calibrate copies γ → γ̃."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

from tapernorm_jax.model.norms import CALIB, CALIB_STATS, Norm
from tapernorm_jax.taper import calibration

D = 24


def _data(seed: int):
  """Tokens with widely varying scales and a non-trivial γ."""
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  h_BxTxD = jax.random.normal(k1, (4, 64, D)) * jnp.exp(0.7 * jax.random.normal(k2, (4, 64, 1))) + 0.3
  gamma_D = 1 + 0.5 * jax.random.normal(k3, (D,))
  return h_BxTxD, gamma_D


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_c_star_is_the_least_squares_minimiser(kind):
  h, gamma = _data(0)
  params = {"gamma": gamma, "gamma_tilde": jnp.ones(D)}
  if kind == "ln":
    params["beta"] = jnp.zeros(D)
  layer = Norm(kind, "taper")
  calib = layer.init(jax.random.key(0), h)[CALIB]
  _, stats = layer.apply({"params": params, CALIB: calib}, h, 1.0, mutable=[CALIB_STATS])
  calib = calibration.ema_update(calib, stats[CALIB_STATS], mu=1.0)
  new_params, new_calib = calibration.calibrate_norms(params, calib, [()], mu=1.0, delta=0.0)

  # Independent path: minimise E‖(h̄/s)γ − c·h̄γ‖² over c numerically, in float64.
  x = np.asarray(h, np.float64).reshape(-1, D)
  xbar = x - x.mean(-1, keepdims=True) if kind == "ln" else x
  s = np.sqrt((xbar**2).mean(-1, keepdims=True) + 1e-5)
  g = np.asarray(gamma, np.float64)
  objective = lambda c: np.mean(np.sum((xbar / s * g - c * xbar * g) ** 2, -1))
  c_numeric = scipy.optimize.minimize_scalar(objective, bracket=(0.1, 10.0), tol=1e-12).x
  np.testing.assert_allclose(new_calib["c"], c_numeric, rtol=1e-5)
  np.testing.assert_array_equal(new_params["gamma_tilde"], gamma)


def test_debiased_ema_of_a_constant_stream_is_the_constant():
  calib = {"layer": {"num": jnp.float32(0), "den": jnp.float32(0), "c": jnp.float32(1), "count": jnp.int32(0)}}
  stats = {"layer": {"num": jnp.float32(2.5), "den": jnp.float32(7.0)}}
  for n in range(1, 40):
    calib = calibration.ema_update(calib, stats, mu=0.01)
    assert int(calib["layer"]["count"]) == n
    np.testing.assert_allclose(
      calibration.debiased(calib["layer"]["num"], calib["layer"]["count"], 0.01), 2.5, rtol=1e-5
    )
  _, out = calibration.calibrate_norms(
    {"layer": {"gamma": jnp.ones(3), "gamma_tilde": jnp.zeros(3)}}, calib, [("layer",)], 0.01, 0.0
  )
  np.testing.assert_allclose(out["layer"]["c"], 2.5 / 7.0, rtol=1e-5)


def test_inactive_update_changes_nothing_and_s_tgt_is_the_debiased_scale():
  calib = {"pre_logit": {"s": jnp.float32(0), "count": jnp.int32(0), "s_tgt": jnp.float32(0)}}
  stats = {"pre_logit": {"s": jnp.float32(3.0)}}
  frozen = calibration.ema_update(calib, stats, mu=0.1, active=jnp.bool_(False))
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(a == b), frozen, calib))
  for _ in range(5):
    calib = calibration.ema_update(calib, stats, mu=0.1)
  calib = calibration.freeze_scale_target(calib, mu=0.1)
  np.testing.assert_allclose(calibration.s_target(calib), 3.0, rtol=1e-5)


def test_a_statistic_without_calibration_entry_is_an_error():
  with pytest.raises(KeyError, match="no calibration entry"):
    calibration.ema_update({"a": {"num": 0.0, "count": 0}}, {"b": {"num": 1.0}}, 0.1)
