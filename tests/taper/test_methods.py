"""The method seam: gradient accumulation, FakeLN's removal schedule, σ_avg, one compilation, and both methods' fold."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from tapernorm_jax.model import ModelConfig, Transformer, param_paths, sharding
from tapernorm_jax.model.norms import Norm
from tapernorm_jax.taper import methods
from tapernorm_jax.taper.fold import fold
from tapernorm_jax.train.trainer import Trainer

B, T, V = 8, 16, 64


def gpt2_cfg(method: str, overrides: dict | None = None):
  """A tiny gpt2-family all_taper config; FakeLN replaces one norm per step from step 2 (MLP 0, 1, attn 0, 1, final)."""
  return base.override(base.get_config("all_taper"), {
      "model.family": "gpt2", "model.D": 32, "model.H": 4, "model.L": 2, "model.T": T, "model.V": V,
      "train.steps": 10, "train.batch_size": B, "taper.gate_warmup_frac": 0.2, "taper.taper_end": 8,
      "taper.mu": 1.0, "opt.lr": 1e-3, "method": method, "fakeln.start": 2, "fakeln.gap_mlp": 1,
      "fakeln.gap_attn": 1, "fakeln.gap_final": 1, "fakeln.mu": 1.0, **(overrides or {})})


def batches(n: int, seed: int = 0) -> list[jax.Array]:
  return [jax.random.randint(k, (B, T + 1), 0, V) for k in jax.random.split(jax.random.key(seed), n)]


@pytest.mark.slow  # about 45 s on 2 cores each: CI runs them after the default suite
@pytest.mark.parametrize("variant", ["baseline", "all_taper"])
def test_k_accumulated_microbatches_give_the_update_of_one_k_times_larger_batch(variant):
  overrides = {"model.D": 32, "model.H": 4, "model.L": 2, "model.T": T, "model.V": V, "train.steps": 10,
               "train.batch_size": B, "taper.gate_warmup_frac": 0.2, "opt.lr": 1e-2}
  mesh = sharding.make_mesh(devices=jax.devices()[:2])
  one = Trainer(base.override(base.get_config(variant), overrides), mesh)
  four = Trainer(base.override(base.get_config(variant), {**overrides, "train.microbatches": 4}), mesh)
  s1, s4 = one.init_state(0), four.init_state(0)
  for batch in batches(3, seed=1):  # through the calibration step and into the taper
    s1, m1 = one.train_step(s1, jax.device_put(batch, one.batch_sharding))
    s4, m4 = four.train_step(s4, jax.device_put(batch, four.batch_sharding))
    np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-5)
    np.testing.assert_allclose(m4["grad_norm"], m1["grad_norm"], rtol=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6), s4["params"], s1["params"])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), s4["calib"], s1["calib"])
  batch = jax.device_put(batches(1, seed=2)[0], one.batch_sharding)  # evaluation goes microbatch by microbatch too
  np.testing.assert_allclose(four.eval_step(s1, batch), one.eval_step(s1, batch), rtol=1e-6)


def test_fakeln_removes_every_mlp_norm_then_every_attention_norm_then_the_final_norm():
  cfg = gpt2_cfg("fakeln", {"fakeln.start": 3, "fakeln.gap_mlp": 2, "fakeln.gap_attn": 1, "fakeln.gap_final": 4})
  model_cfg = ModelConfig.from_config(cfg.model)
  removal = methods.removal_steps(model_cfg, cfg.fakeln)
  assert removal == {("block_0", "mlp_norm"): 3, ("block_1", "mlp_norm"): 5, ("block_0", "attn_norm"): 7,
                     ("block_1", "attn_norm"): 8, ("final_norm",): 12}
  method = methods.FakeLN(cfg, model_cfg, None)
  order = [site.norm for site in param_paths.norm_sites(model_cfg)]
  for step in range(14):
    gates = np.asarray(method.gates(jnp.int32(step)))
    np.testing.assert_array_equal(gates, [0.0 if step >= removal[norm] else 1.0 for norm in order])


def norm_inputs(variables, cfg: ModelConfig, tokens, gates) -> dict[str, np.ndarray]:
  """The input of every Norm call, by module path (flax method interception: a second path to the statistics)."""
  seen = {}

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, Norm) and context.method_name == "__call__":
      seen["/".join(context.module.path)] = np.asarray(args[0], np.float64)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    Transformer(cfg).apply(variables, tokens, gates)
  return seen


def test_fakeln_freezes_each_norm_at_its_step_with_c_equal_to_one_over_the_average_std():
  cfg = gpt2_cfg("fakeln")  # μ = 1: σ_avg is the previous step's batch-mean std
  trainer = Trainer(cfg, sharding.make_mesh(devices=jax.devices()[:1]))
  removal = trainer.method.removal
  sigma_avg = {}
  state = trainer.init_state(0)
  for k, batch in enumerate(batches(8)):
    before = jax.device_get(state)
    params, calib = trainer.method.calibrate(before["params"], before["calib"], jnp.int32(k))  # as the step sees them
    inputs = norm_inputs({"params": params, "calib": calib}, trainer.model_cfg, batch[:, :-1],
                         trainer.method.gates(jnp.int32(k)))
    state, metrics = trainer.train_step(state, batch)
    after = jax.device_get(state)
    for norm, step in removal.items():
      calib_after, params_after = after["calib"], after["params"]
      for name in norm:
        calib_after, params_after = calib_after[name], params_after[name]
      if k == step - 1:  # the last step of statistics, directly: the batch mean of σ of the norm's input
        h = inputs["/".join(norm)]
        hbar = h - h.mean(-1, keepdims=True)
        sigma_avg[norm] = np.mean(np.sqrt(np.mean(hbar**2, -1) + cfg.model.eps))
      if k < step:
        assert float(calib_after["c"]) == 1.0, (norm, k)  # untouched before its step
      if k == step:  # frozen at the start of its removal step; γ̃ was γ then
        np.testing.assert_allclose(calib_after["c"], 1.0 / sigma_avg[norm], rtol=1e-5)
        assert int(calib_after["count"]) == step  # statistics stop at the removal step
  assert float(metrics["gate"]) == 0.0  # every gate is off after the final norm's step (6)
  assert trainer.train_step._cache_size() == 1  # five gate switches, one compilation


@pytest.mark.slow  # about 25 s on 2 cores each: CI runs them after the default suite (taper: also test_fold)
@pytest.mark.parametrize("method", ["taper", "fakeln"])
def test_both_methods_fold_to_their_unfolded_gate_zero_forward(method):
  cfg = gpt2_cfg(method)
  trainer = Trainer(cfg, sharding.make_mesh(devices=jax.devices()[:1]))
  state = trainer.init_state(0)
  for batch in batches(9):
    state, _ = trainer.train_step(state, batch)
  variables = {"params": state["params"], "calib": state["calib"]}
  tokens = batches(1, seed=5)[0][:, :-1]
  unfolded = Transformer(trainer.model_cfg).apply(variables, tokens, 0.0)
  folded, folded_cfg = fold(variables, trainer.model_cfg)
  got = Transformer(folded_cfg).apply(folded, tokens)
  assert float(jnp.max(jnp.abs(got - unfolded)) / jnp.max(jnp.abs(unfolded))) < 1e-5
