"""The method seam: gradient accumulation, FakeLN's removal schedule (attention norms in two stages), σ_avg, its aux
loss, one compilation, and both methods' fold (FakeLN's also mid-schedule)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from tapernorm_jax.model import ModelConfig, Transformer, sharding
from tapernorm_jax.model.gates import Gates
from tapernorm_jax.model.norms import Norm
from tapernorm_jax.taper import losses, methods
from tapernorm_jax.taper.fold import fold
from tapernorm_jax.train import gpt2_config
from tapernorm_jax.train.trainer import Trainer

B, T, V = 8, 16, 64


def gpt2_cfg(method: str, overrides: dict | None = None):
  """A tiny gpt2-family all_taper config; FakeLN replaces one norm path per step from step 2 (MLP 0, 1, attention q/k
  0, 1, attention v 0, 1, final: steps 2…8)."""
  return base.override(
    base.get_config("all_taper"),
    {
      "model.family": "gpt2",
      "model.D": 32,
      "model.H": 4,
      "model.L": 2,
      "model.T": T,
      "model.V": V,
      "train.steps": 10,
      "train.batch_size": B,
      "taper.gate_warmup_frac": 0.2,
      "taper.taper_end": 8,
      "taper.mu": 1.0,
      "opt.lr": 1e-3,
      "method": method,
      "fakeln.start": 2,
      "fakeln.gap_mlp": 1,
      "fakeln.gap_attn": 1,
      "fakeln.gap_attn_v": 1,
      "fakeln.gap_final": 1,
      "fakeln.mu": 1.0,
      "fakeln.eot_id": 7,
      **(overrides or {}),
    },
  )


def batches(n: int, seed: int = 0) -> list[jax.Array]:
  return [jax.random.randint(k, (B, T + 1), 0, V) for k in jax.random.split(jax.random.key(seed), n)]


@pytest.mark.slow  # about 45 s on 2 cores each: CI runs them after the default suite
@pytest.mark.parametrize("variant", ["baseline", "all_taper"])
def test_k_accumulated_microbatches_give_the_update_of_one_k_times_larger_batch(variant):
  overrides = {
    "model.D": 32,
    "model.H": 4,
    "model.L": 2,
    "model.T": T,
    "model.V": V,
    "train.steps": 10,
    "train.batch_size": B,
    "taper.gate_warmup_frac": 0.2,
    "opt.lr": 1e-2,
  }
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


@pytest.mark.parametrize("start,gap_ln2,gap_ln1qk,gap_ln1v", [(3, 2, 1, 4), (20, 2, 2, 3), (30, 4, 4, 6)])
def test_fakeln_removes_mlp_norms_then_attention_q_k_then_attention_v_then_the_final_norm(
  start, gap_ln2, gap_ln1qk, gap_ln1v
):
  cfg = gpt2_cfg(
    "fakeln",
    {
      "fakeln.start": start,
      "fakeln.gap_mlp": gap_ln2,
      "fakeln.gap_attn": gap_ln1qk,
      "fakeln.gap_attn_v": gap_ln1v,
      "fakeln.gap_final": gap_ln1v,
      "train.steps": 200,
    },
  )
  model_cfg = ModelConfig.from_config(cfg.model)
  L = model_cfg.L
  # The authors' schedule (removing-layer-norm, config.py and train.py's LNRemover): layer i's ln_2 at
  # start_ln2 + i·gap_ln2, its ln_1 on the q/k path at start_ln1qk + i·gap_ln1qk, on the v path at
  # start_ln1v + i·gap_ln1v, ln_f at start_lnf.
  start_ln1qk = start + L * gap_ln2
  start_ln1v = start_ln1qk + L * gap_ln1qk
  start_lnf = start_ln1v + L * gap_ln1v
  removal, value_removal = methods.removal_steps(model_cfg, cfg.fakeln)
  assert removal == {
    **{(f"block_{i}", "mlp_norm"): start + i * gap_ln2 for i in range(L)},
    **{(f"block_{i}", "attn_norm"): start_ln1qk + i * gap_ln1qk for i in range(L)},
    ("final_norm",): start_lnf,
  }
  assert value_removal == {(f"block_{i}", "attn_norm"): start_ln1v + i * gap_ln1v for i in range(L)}
  method = methods.FakeLN(cfg, model_cfg, None)
  for step in range(start_lnf + 2):
    gates = method.gates(jnp.int32(step))
    np.testing.assert_array_equal(gates.mlp, [float(step < start + i * gap_ln2) for i in range(L)])
    np.testing.assert_array_equal(gates.attn, [float(step < start_ln1qk + i * gap_ln1qk) for i in range(L)])
    np.testing.assert_array_equal(gates.attn_value, [float(step < start_ln1v + i * gap_ln1v) for i in range(L)])
    assert float(gates.final) == float(step < start_lnf)


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


@pytest.mark.parametrize("sigma_steps", [0, 1])  # σ until each removal; σ of the starting model (the first batch)
def test_fakeln_freezes_each_norm_at_its_step_with_c_equal_to_one_over_the_average_std(sigma_steps):
  cfg = gpt2_cfg("fakeln", {"fakeln.sigma_steps": sigma_steps})  # μ = 1: σ_avg is the last measured batch's
  trainer = Trainer(cfg, sharding.make_mesh(devices=jax.devices()[:1]))
  removal = trainer.method.removal
  sigma_avg = {}
  state = trainer.init_state(0)
  for k, batch in enumerate(batches(10)):
    before = jax.device_get(state)
    params, calib = trainer.method.calibrate(before["params"], before["calib"], jnp.int32(k))  # as the step sees them
    inputs = norm_inputs(
      {"params": params, "calib": calib}, trainer.model_cfg, batch[:, :-1], trainer.method.gates(jnp.int32(k))
    )
    state, metrics = trainer.train_step(state, batch)
    after = jax.device_get(state)
    for norm, step in removal.items():
      calib_after, params_after = after["calib"], after["params"]
      for name in norm:
        calib_after, params_after = calib_after[name], params_after[name]
      if k == (sigma_steps or step) - 1:  # the last step of statistics, directly: the batch mean of σ of its input
        h = inputs["/".join(norm)]
        hbar = h - h.mean(-1, keepdims=True)
        sigma_avg[norm] = np.mean(np.sqrt(np.mean(hbar**2, -1) + cfg.model.eps)[:, 1:])  # position 0 left out
      if k < step:
        assert float(calib_after["c"]) == 1.0, (norm, k)  # untouched before its step
      if k == step:  # frozen at the start of its removal step; γ̃ was γ then
        np.testing.assert_allclose(calib_after["c"], 1.0 / sigma_avg[norm], rtol=1e-5)
        assert int(calib_after["count"]) == (sigma_steps or step)  # statistics stop at the removal step, or before
  assert float(metrics["gate"]) == 0.0  # every gate is off after the final norm's step (8)
  assert trainer.train_step._cache_size() == 1  # seven gate switches, one compilation


def test_an_attention_norm_between_its_two_removals_feeds_queries_and_keys_its_fixed_map_and_values_layernorm():
  cfg = ModelConfig.from_config(gpt2_cfg("fakeln").model)
  tokens = batches(1)[0][:, :-1]
  variables = nn.unbox(Transformer(cfg).init(jax.random.key(0), tokens))
  norm = variables["params"]["block_0"]["attn_norm"]
  norm["gamma"] = 1.0 + 0.1 * jax.random.normal(jax.random.key(1), norm["gamma"].shape)
  norm["gamma_tilde"] = 1.0 + 0.1 * jax.random.normal(jax.random.key(2), norm["gamma"].shape)
  norm["beta"] = 0.1 * jax.random.normal(jax.random.key(3), norm["gamma"].shape)
  variables["calib"]["block_0"]["attn_norm"]["c"] = jnp.float32(0.7)
  seen = {}

  def record(next_fun, args, kwargs, context):
    if "/".join(context.module.path) in ("block_0/attn_norm", "block_0/attn") and context.method_name == "__call__":
      seen["/".join(context.module.path)] = (args, kwargs)
    return next_fun(*args, **kwargs)

  ones = jnp.ones(cfg.L, jnp.float32)
  gates = Gates(attn=ones.at[0].set(0.0), mlp=ones, final=jnp.float32(1.0), attn_value=ones)  # block 0's q/k path
  with nn.intercept_methods(record):  # removed, its value path not yet
    Transformer(cfg).apply(variables, tokens, gates)
  h = np.asarray(seen["block_0/attn_norm"][0][0], np.float64)
  x, x_v = np.asarray(seen["block_0/attn"][0][0]), np.asarray(seen["block_0/attn"][1]["x_v_BxTxD"])
  hbar = h - h.mean(-1, keepdims=True)
  gamma, gamma_tilde, beta = (np.asarray(norm[k], np.float64) for k in ("gamma", "gamma_tilde", "beta"))
  np.testing.assert_allclose(x, 0.7 * hbar * gamma_tilde + beta, rtol=1e-5, atol=1e-6)  # FakeLN: c·(h − μ)·γ̃ + β
  np.testing.assert_allclose(
    x_v, hbar / np.sqrt((hbar**2).mean(-1, keepdims=True) + cfg.eps) * gamma + beta, rtol=1e-5, atol=1e-6
  )  # LayerNorm
  same = gates._replace(attn_value=gates.attn)  # value gates equal to their norms' gates: one path, as without them
  np.testing.assert_allclose(
    Transformer(cfg).apply(variables, tokens, same),  # split GEMMs: rounding
    Transformer(cfg).apply(variables, tokens, gates._replace(attn_value=None)),
    atol=1e-6,
  )


def test_fakeln_aux_loss_pulls_every_token_to_the_mean_scale_of_the_ordinary_tokens():
  cfg = gpt2_cfg("fakeln")  # eot_id = 7
  method = methods.FakeLN(cfg, ModelConfig.from_config(cfg.model), None)
  h_BxTxD = jax.random.normal(jax.random.key(0), (2, 4, 32)) * jnp.arange(1.0, 9.0).reshape(2, 4, 1)
  tokens_BxT = jnp.array([[5, 7, 9, 9], [3, 4, 7, 7]])  # end-of-text at (0, 1), (1, 2), (1, 3)
  weight, loss = method.scale_loss_terms(h_BxTxD, None, jnp.int32(0), tokens_BxT)  # on from step 0
  h = np.asarray(h_BxTxD, np.float64)
  s = np.sqrt(((h - h.mean(-1, keepdims=True)) ** 2).mean(-1) + cfg.model.eps)  # the pre-logit σ per token
  target = np.mean([s[0, 2], s[0, 3], s[1, 1]])  # neither position 0 nor end-of-text
  assert float(weight) == np.float32(cfg.fakeln.scale_loss_weight)
  np.testing.assert_allclose(loss, np.mean((s - target) ** 2), rtol=1e-5)  # every token is pulled
  grad = jax.grad(lambda h: method.scale_loss_terms(h, None, jnp.int32(0), tokens_BxT)[1])(h_BxTxD)
  np.testing.assert_allclose(  # the target is held constant: the gradient of a fixed-target loss
    grad,
    jax.grad(lambda h: losses.scale_loss(h, jnp.float32(target), "ln", cfg.model.eps))(h_BxTxD),
    rtol=1e-4,
    atol=1e-7,
  )


@pytest.mark.slow  # about 25 s on 2 cores each: CI runs them after the default suite (taper: also test_fold)
@pytest.mark.parametrize("method,steps", [("taper", 9), ("fakeln", 9), ("fakeln", 5)])  # 5: mid-schedule
def test_both_methods_fold_to_their_unfolded_gate_zero_forward(method, steps):
  cfg = gpt2_cfg(method)
  trainer = Trainer(cfg, sharding.make_mesh(devices=jax.devices()[:1]))
  state = trainer.init_state(0)
  for batch in batches(steps):
    state, _ = trainer.train_step(state, batch)
  variables = {"params": state["params"], "calib": state["calib"]}
  tokens = batches(1, seed=5)[0][:, :-1]
  unfolded = Transformer(trainer.model_cfg).apply(variables, tokens, 0.0)
  folded, folded_cfg = fold(variables, trainer.model_cfg)
  got = Transformer(folded_cfg).apply(folded, tokens)
  assert float(jnp.max(jnp.abs(got - unfolded)) / jnp.max(jnp.abs(unfolded))) < 1e-5


def test_only_another_methods_changed_fields_are_named_as_unused():
  cfg = base.override(base.get_config("all_taper"), {"fakeln.start": 50, "prepbn.blend_end": 200, "taper.mu": 0.02})
  lines = methods.unused_settings(cfg, "taper")
  assert [line.split(" ")[0] for line in lines] == ["fakeln.start=50", "prepbn.blend_end=200"]
  for variant in ("baseline", "all_taper", "fakeln", "prepbn"):  # every shipped config, and each GPT-2 variant's
    shipped = base.get_config(variant)
    assert methods.unused_settings(shipped, methods.name(shipped)) == [], variant
    gpt2 = gpt2_config.get_config(f"model=demo,variant={variant}")
    assert methods.unused_settings(gpt2, methods.name(gpt2)) == [], variant
