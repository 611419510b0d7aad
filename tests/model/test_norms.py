"""TaperNorm against RMSNorm / LayerNorm (g = 1) and against its fixed linear map (g = 0)."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tapernorm_jax.model.norms import CALIB, CALIB_STATS, Norm

D = 32


def _variables(kind: str, seed: int = 0) -> dict:
  """Taper variables with non-trivial γ, γ̃, β and c."""
  k = jax.random.split(jax.random.key(seed), 4)
  params = {"gamma": 1 + 0.3 * jax.random.normal(k[0], (D,)), "gamma_tilde": 1 + 0.3 * jax.random.normal(k[1], (D,))}
  if kind == "ln":
    params["beta"] = 0.5 * jax.random.normal(k[2], (D,))
  calib = {
    "c": jnp.float32(0.37),
    "num": jnp.float32(0),
    "den": jnp.float32(0),
    "s": jnp.float32(0),
    "count": jnp.int32(0),
  }
  return {"params": params, CALIB: calib}


def _x(seed: int = 1, shape=(3, 5, D)) -> jax.Array:
  """Inputs with a per-token scale spread, so the norm's statistics matter."""
  k1, k2 = jax.random.split(jax.random.key(seed))
  return jax.random.normal(k1, shape) * jnp.exp(jax.random.normal(k2, shape[:-1] + (1,))) + 0.2


def _plain_vars(v: dict) -> dict:
  """The plain layer's subset of the taper variables."""
  return {"params": {k: p for k, p in v["params"].items() if k != "gamma_tilde"}}


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_gate_one_is_exactly_the_plain_norm_forward_and_gradients(kind):
  v, x = _variables(kind), _x()
  taper, plain = Norm(kind, "taper"), Norm(kind, "plain")
  np.testing.assert_array_equal(taper.apply(v, x, 1.0), plain.apply(_plain_vars(v), x))

  def loss(fn, params, x):
    return jnp.sum(jnp.sin(fn(params, x)))

  taper_fn = lambda p, x: taper.apply({"params": p, CALIB: v[CALIB]}, x, 1.0)
  plain_fn = lambda p, x: plain.apply({"params": p}, x)
  gt = jax.grad(loss, argnums=(1, 2))(taper_fn, v["params"], x)
  gp = jax.grad(loss, argnums=(1, 2))(plain_fn, _plain_vars(v)["params"], x)
  np.testing.assert_array_equal(gt[1], gp[1])
  for name in gp[0]:
    np.testing.assert_array_equal(gt[0][name], gp[0][name])
  np.testing.assert_array_equal(gt[0]["gamma_tilde"], 0.0)


def test_gate_zero_is_c_h_gamma_tilde_for_rms():
  v, x = _variables("rms"), _x()
  expected = 0.37 * x * v["params"]["gamma_tilde"]
  np.testing.assert_allclose(Norm("rms", "taper").apply(v, x, 0.0), expected, rtol=1e-6)
  np.testing.assert_allclose(Norm("rms", "fixed").apply(v, x), expected, rtol=1e-6)


def test_gate_zero_is_the_affine_map_hA_plus_beta_for_ln():
  v, x = _variables("ln"), _x()
  p = v["params"]
  A_DxD = 0.37 * (jnp.eye(D) - jnp.ones((D, D)) / D) @ jnp.diag(p["gamma_tilde"])
  expected = x @ A_DxD + p["beta"]
  np.testing.assert_allclose(Norm("ln", "taper").apply(v, x, 0.0), expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(Norm("ln", "fixed").apply(v, x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_intermediate_gate_mixes_the_two_branches_linearly(kind):
  v, x = _variables(kind), _x()
  at = lambda g: Norm(kind, "taper").apply(v, x, g)
  np.testing.assert_allclose(at(0.3), 0.3 * at(1.0) + 0.7 * at(0.0), rtol=1e-5, atol=1e-6)


def test_identity_returns_its_input_and_has_no_variables():
  x = _x()
  v = Norm("rms", "identity").init(jax.random.key(0), x)
  assert not jax.tree.leaves(v)
  np.testing.assert_array_equal(Norm("rms", "identity").apply(v, x), x)


def test_statistics_in_fp32_and_result_in_compute_dtype():
  x = (_x() * 300).astype(jnp.bfloat16)
  v = _plain_vars(_variables("rms"))
  y = Norm("rms", "plain", dtype=jnp.bfloat16).apply(v, x)
  assert y.dtype == jnp.bfloat16
  x32 = x.astype(jnp.float32)
  ref = x32 / jnp.sqrt(jnp.mean(x32**2, -1, keepdims=True) + 1e-5) * v["params"]["gamma"]
  np.testing.assert_allclose(y.astype(jnp.float32), ref, rtol=1e-2)


def test_one_compilation_serves_every_gate_value():
  v, x = _variables("rms"), _x()
  fn = jax.jit(lambda g: Norm("rms", "taper").apply(v, x, g))
  outs = [fn(jnp.float32(g)) for g in (1.0, 0.5, 0.0, 0.25)]
  assert fn._cache_size() == 1
  np.testing.assert_allclose(outs[1], 0.5 * (outs[0] + outs[2]), rtol=1e-5, atol=1e-6)


def test_batch_statistics_are_recorded_only_when_asked():
  v, x = _variables("rms"), _x()
  _, mutated = Norm("rms", "taper").apply(v, x, 1.0, mutable=[CALIB_STATS])
  hg = x * v["params"]["gamma"]
  sq = jnp.sum(hg**2, -1)
  r = jnp.sqrt(jnp.mean(x**2, -1) + 1e-5)
  np.testing.assert_allclose(mutated[CALIB_STATS]["num"], jnp.mean(sq / r), rtol=1e-5)
  np.testing.assert_allclose(mutated[CALIB_STATS]["den"], jnp.mean(sq), rtol=1e-5)
  assert not isinstance(Norm("rms", "taper").apply(v, x, 1.0), tuple)


def test_taper_and_fixed_share_variables_with_logical_axes():
  x = _x()
  vt = Norm("ln", "taper").init(jax.random.key(0), x)
  vs = Norm("ln", "fixed").init(jax.random.key(0), x)
  assert jax.tree.structure(vt) == jax.tree.structure(vs)
  specs = nn.get_partition_spec(vt)["params"]
  assert all(tuple(s) == ("norm",) for s in specs.values())


@pytest.mark.parametrize("kind", ["rms", "ln"])
@pytest.mark.parametrize("mode", ["dyt", "derf"])
def test_the_pointwise_norms_are_their_authors_formulas(kind, mode):
  # DyT: γ·tanh(α·h) + β; Derf: γ·erf(α·h + s) + β; β for LN only (numpy and math.erf, an independent computation).
  norm = Norm(kind, mode, alpha_init=0.7, shift_init=0.1)
  x = _x()
  initial = nn.unbox(norm.init(jax.random.key(0), x))["params"]
  assert float(initial["alpha"]) == pytest.approx(0.7) and ("shift" in initial) == (mode == "derf")
  assert ("beta" in initial) == (kind == "ln") and "gamma_tilde" not in initial
  rng = np.random.default_rng(0)
  params = {k: np.asarray(rng.normal(1.0, 0.3, np.shape(v)), np.float32) for k, v in initial.items()}
  h = np.asarray(x, np.float64)
  z = float(params["alpha"]) * h + (float(params["shift"]) if mode == "derf" else 0.0)
  f = np.tanh(z) if mode == "dyt" else np.vectorize(math.erf)(z)
  expected = f * params["gamma"] + (params["beta"] if kind == "ln" else 0.0)
  out = norm.apply({"params": params}, x, 0.3)  # a gate leaves it as it is
  np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6)
  both = norm.apply({"params": params}, x, 0.3, 0.0)
  np.testing.assert_array_equal(both[0], out)
  np.testing.assert_array_equal(both[1], out)
