"""The jitted train step: calibration at the taper start, one compilation, the g = 0 fixed step, the optimiser."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from tapernorm_jax.model import sharding
from tapernorm_jax.taper import calibration, schedules
from tapernorm_jax.train.trainer import Trainer, make_optimizer


def tiny(variant: str = "all_taper", overrides: dict | None = None):
  """A seconds-sized config: D=32, 2 layers, T=16, vocab 64, 12 steps, taper 3 → 9; `overrides` has dotted keys."""
  cfg = base.get_config(variant)
  cfg.model.update(D=32, H=4, L=2, T=16, V=64)
  cfg.train.update(steps=12, batch_size=8)
  cfg.taper.update(gate_warmup_frac=0.25, taper_end=9)
  return base.override(cfg, overrides or {})


def batches(n: int, cfg, seed: int = 0) -> list[jax.Array]:
  """Random token windows (B, T+1)."""
  keys = jax.random.split(jax.random.key(seed), n)
  return [jax.random.randint(k, (cfg.train.batch_size, cfg.model.T + 1), 0, cfg.model.V) for k in keys]


@pytest.fixture(scope="module")
def trainer():
  return Trainer(tiny(), sharding.make_mesh())


def test_calibration_at_the_taper_start(trainer):
  state = trainer.init_state(0)
  data = batches(5, trainer.cfg)
  start = trainer.phases.taper_start
  assert start == 3
  for k in range(start):
    state, _ = trainer.train_step(state, data[k])
    assert int(state["calib"]["block_0"]["attn_norm"]["count"]) == k + 1
  before = jax.device_get(state)
  expected_params, expected_calib = calibration.calibrate(
    before["params"], before["calib"], trainer.method.norms, 0.01, 1e-8
  )
  state, _ = trainer.train_step(state, data[start])
  after = jax.device_get(state)
  for path, c in calibration.norm_scalars(after["calib"], trainer.method.norms, "c").items():
    want = calibration.norm_scalars(expected_calib, trainer.method.norms, "c")[path]
    np.testing.assert_allclose(c, want, rtol=1e-6)
    assert np.isfinite(c) and abs(c - 1.0) > 1e-3
  np.testing.assert_allclose(after["calib"]["pre_logit"]["s_tgt"], expected_calib["pre_logit"]["s_tgt"], rtol=1e-6)
  # γ̃ started this step as a copy of γ; EMAs are frozen from here on.
  assert not np.allclose(
    before["params"]["block_0"]["attn_norm"]["gamma_tilde"], before["params"]["block_0"]["attn_norm"]["gamma"]
  )
  np.testing.assert_allclose(
    after["params"]["block_0"]["attn_norm"]["gamma_tilde"],
    expected_params["block_0"]["attn_norm"]["gamma"],
    atol=2 * trainer.lr(start) + 1e-7,
  )
  state, _ = trainer.train_step(state, data[start + 1])
  assert int(state["calib"]["block_0"]["attn_norm"]["count"]) == start
  np.testing.assert_array_equal(
    state["calib"]["block_0"]["attn_norm"]["c"], after["calib"]["block_0"]["attn_norm"]["c"]
  )


def test_gate_moves_without_recompiling_and_aux_turns_on_at_the_taper_start(trainer):
  state = trainer.init_state(1)
  gates = []
  for k, batch in enumerate(batches(trainer.phases.taper_end, trainer.cfg, seed=1)):
    state, m = trainer.train_step(state, batch)
    gates.append(float(m["gate"]))
    np.testing.assert_allclose(
      m["loss"], m["ce"] + (0.1 * m["scale_loss"] if k >= trainer.phases.taper_start else 0), rtol=1e-6
    )
  assert trainer.train_step._cache_size() == 1
  np.testing.assert_allclose(gates, [float(schedules.gate(k, trainer.phases)) for k in range(len(gates))], atol=1e-6)
  assert gates[0] == 1.0 and 0 < gates[-1] < 1


def test_fixed_step_equals_the_tapered_step_once_the_gate_is_zero(trainer):
  state = trainer.init_state(2)
  data = batches(trainer.phases.taper_end + 1, trainer.cfg, seed=2)
  for batch in data[:-1]:
    state, _ = trainer.train_step(state, batch)
  assert trainer.uses_fixed_step(trainer.phases.taper_end) and not trainer.uses_fixed_step(trainer.phases.taper_end - 1)
  copy = jax.tree.map(jnp.copy, state)
  slow, m_slow = trainer.train_step(state, data[-1])
  fixed, m_fixed = trainer.fixed_train_step(copy, data[-1])
  assert float(m_slow["gate"]) == 0.0
  np.testing.assert_allclose(m_fixed["loss"], m_slow["loss"], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), fixed, slow)


def test_calibration_state_never_enters_the_optimiser(trainer):
  state = trainer.init_state(0)
  adam_mu = state["opt_state"][1][0].mu
  assert jax.tree.structure(adam_mu) == jax.tree.structure(state["params"])
  assert "calib" not in str(jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(state["opt_state"])[0][0][0]))


def test_weight_decay_skips_norm_gains_and_scalars():
  cfg = tiny(overrides={"opt.weight_decay": 0.1})
  tx = make_optimizer(cfg, schedules.learning_rate(cfg.opt.lr, schedules.Phases.from_config(cfg)))
  params = {"w": jnp.ones((3, 4)), "gamma": jnp.ones(4), "gamma_tilde": jnp.ones(4)}
  opt_state = tx.init(params)
  for _ in range(3):  # past the first (lr = 0) step of the warmup
    updates, opt_state = tx.update(jax.tree.map(jnp.zeros_like, params), opt_state, params)
  assert float(jnp.abs(updates["w"]).max()) > 0
  assert float(jnp.abs(updates["gamma"]).max()) == 0 and float(jnp.abs(updates["gamma_tilde"]).max()) == 0


@pytest.mark.slow  # 25–80 s on 2 cores: CI runs it after the default suite
def test_sharded_fsdp_step_matches_a_single_device_step():
  cfg = tiny()
  one = Trainer(cfg, sharding.make_mesh(devices=jax.devices()[:1]))
  eight = Trainer(cfg, sharding.make_mesh(data=2, fsdp=4))
  s1, s8 = one.init_state(0), eight.init_state(0)
  assert len(s8["params"]["block_0"]["mlp"]["wi_0"].sharding.device_set) == 8
  for batch in batches(4, cfg, seed=3):
    s1, m1 = one.train_step(s1, batch)
    s8, m8 = eight.train_step(s8, jax.device_put(batch, eight.batch_sharding))
    np.testing.assert_allclose(m1["loss"], m8["loss"], rtol=1e-5)


def test_weights_cast_before_the_fsdp_gather_train_as_weights_cast_after_it():
  """mesh.gather_dtype=compute differentiates a bf16 copy of the weights where they lie; the forward is the same
  computation as casting after the gather (param), and the gradients differ only by their bf16 rounding."""
  runs = {}
  for gather in ("compute", "param"):
    cfg = tiny(overrides={"model.dtype": "bfloat16", "mesh.gather_dtype": gather})
    trainer = Trainer(cfg, sharding.make_mesh(data=2, fsdp=4))
    state, metrics = trainer.init_state(0), []
    for batch in batches(3, cfg, seed=5):
      state, m = trainer.train_step(state, jax.device_put(batch, trainer.batch_sharding))
      metrics.append(jax.device_get(m))
    runs[gather] = metrics
  compute, param = runs["compute"], runs["param"]
  assert compute[0]["loss"] == param[0]["loss"]  # the same forward pass
  assert compute[0]["grad_norm"] != param[0]["grad_norm"]  # compute's gradients come through the bf16 copy
  np.testing.assert_allclose(compute[0]["grad_norm"], param[0]["grad_norm"], rtol=1e-2)
  np.testing.assert_allclose([m["loss"] for m in compute], [m["loss"] for m in param], rtol=1e-2)


@pytest.mark.parametrize(
  "overrides,field",
  [
    ({"taper.gate_warmup_frac": 0.9, "taper.taper_end": 5}, "taper.gate_warmup_frac"),
    ({"taper.gate_warmup_frac": 1.5}, "taper.gate_warmup_frac"),
    ({"taper.taper_end": 50}, "taper.taper_end"),
    ({"taper.scale_loss_weight": -0.1}, "taper.scale_loss_weight"),
    ({"taper.mu": 0.0}, "taper.mu"),
    ({"taper.mu": 1.5}, "taper.mu"),
    ({"taper.scale_loss_form": "tokens"}, "taper.scale_loss_form"),
    ({"train.batch_size": 6}, "train.batch_size"),
    ({"taper.gate_warmup_frac": 0.0}, "taper.gate_warmup_frac"),
    ({"mesh.gather_dtype": "fp8"}, "mesh.gather_dtype"),
  ],
)
def test_inconsistent_configs_fail_before_compiling(overrides, field):
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    Trainer(tiny(overrides=overrides), sharding.make_mesh())


def test_removing_the_final_anchor_without_aux_warns(caplog):
  with caplog.at_level(logging.WARNING):
    Trainer(tiny("final_taper", {"taper.scale_loss_weight": 0.0}), sharding.make_mesh())
  assert "logits may grow without bound" in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    Trainer(tiny("internal_taper"), sharding.make_mesh())
  assert "logits may grow" not in caplog.text


@pytest.mark.parametrize("variant", ["dyt", "derf"])
def test_a_pointwise_variant_trains_its_alphas_and_has_nothing_to_fold(variant, caplog):
  from tapernorm_jax.taper import fold  # noqa: PLC0415

  with caplog.at_level(logging.WARNING):
    trainer = Trainer(tiny(variant), sharding.make_mesh())
  assert "nothing anchors" not in caplog.text  # a bounded final function anchors the pre-logit scale itself
  state = trainer.init_state(0)
  first = jax.device_get(state["params"])
  losses = []
  for batch in batches(4, trainer.cfg) * 3:
    state, metrics = trainer.train_step(state, batch)
    losses.append(float(metrics["loss"]))
  after = jax.device_get(state["params"])
  assert float(metrics["gate"]) == 1.0 and losses[-1] < losses[0]
  for path in (("block_0", "attn_norm", "alpha"), ("final_norm", "alpha"), ("embed_scale",)):
    a, b = first, after
    for name in path:
      a, b = a[name], b[name]
    assert float(a) != float(b), path  # trained
  with pytest.raises(ValueError, match="nothing to fold"):
    fold.fold({"params": state["params"], "calib": state["calib"]}, trainer.model_cfg)
