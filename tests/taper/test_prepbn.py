"""PRepBN: the repbn norm against numpy's BatchNorm, the authors' λ schedule, running statistics, fold, causality."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from configs import base
from tapernorm_jax.model import ModelConfig, Transformer, init, sharding
from tapernorm_jax.model.norms import CALIB, CALIB_STATS, Norm
from tapernorm_jax.taper import calibration, methods, schedules
from tapernorm_jax.taper.fold import fold
from tapernorm_jax.train.trainer import Trainer

D, EPS = 16, 1e-5


def _norm_variables(kind: str, seed: int = 0) -> dict:
  """A repbn layer's variables with every parameter and running statistic off its initial value."""
  k = jax.random.split(jax.random.key(seed), 7)
  params = {
    "gamma": 1 + 0.3 * jax.random.normal(k[0], (D,)),
    "bn_gamma": jax.random.normal(k[1], (D,)),
    "bn_beta": jax.random.normal(k[2], (D,)),
    "eta": jnp.float32(0.7),
  }
  if kind == "ln":
    params["beta"] = 0.5 * jax.random.normal(k[3], (D,))
  calib = {"mean": jax.random.normal(k[4], (D,)), "var": jnp.exp(jax.random.normal(k[5], (D,))), "count": jnp.int32(3)}
  return {"params": params, CALIB: calib}


def _numpy_norm(x, p, kind):
  """RMSNorm / LayerNorm in float64."""
  xbar = x - x.mean(-1, keepdims=True) if kind == "ln" else x
  return xbar / np.sqrt((xbar**2).mean(-1, keepdims=True) + EPS) * p["gamma"] + p.get("beta", 0.0)


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_repbn_is_batchnorm_plus_eta_x_over_the_batch_in_training_and_running_statistics_elsewhere(kind):
  v = _norm_variables(kind)
  x = np.asarray(jax.random.normal(jax.random.key(9), (3, 5, D)) * 2 + 0.4, np.float64)
  p = {name: np.asarray(a, np.float64) for name, a in v["params"].items()}
  layer, g = Norm(kind, "repbn", eps=EPS), 0.3
  out, stats = layer.apply(v, jnp.asarray(x, jnp.float32), g, mutable=[CALIB_STATS])
  mean, var = x.reshape(-1, D).mean(0), x.reshape(-1, D).var(0)  # torch.nn.BatchNorm1d in training
  rep = (x - mean) / np.sqrt(var + EPS) * p["bn_gamma"] + p["bn_beta"] + p["eta"] * x
  np.testing.assert_allclose(out, g * _numpy_norm(x, p, kind) + (1 - g) * rep, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(stats[CALIB_STATS]["mean"], mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats[CALIB_STATS]["var"], x.reshape(-1, D).var(0, ddof=1), rtol=1e-5)  # unbiased
  running_mean, running_var = (np.asarray(v[CALIB][n], np.float64) for n in ("mean", "var"))
  rep_eval = (x - running_mean) / np.sqrt(running_var + EPS) * p["bn_gamma"] + p["bn_beta"] + p["eta"] * x
  np.testing.assert_allclose(layer.apply(v, jnp.asarray(x, jnp.float32), 0.0), rep_eval, rtol=2e-5, atol=2e-5)
  # PyTorch's BatchNorm1d(momentum=0.1) running update, from the step's recorded statistics
  updated = calibration.ema_update(v[CALIB], stats[CALIB_STATS], 0.1)
  np.testing.assert_allclose(updated["var"], 0.9 * running_var + 0.1 * x.reshape(-1, D).var(0, ddof=1), rtol=1e-5)
  np.testing.assert_allclose(updated["mean"], 0.9 * running_mean + 0.1 * mean, rtol=1e-5, atol=1e-6)
  assert int(updated["count"]) == 4


def test_a_new_repbn_starts_as_zero_and_its_running_statistics_as_batchnorm_s():
  v = init(ModelConfig(D=D, H=2, L=1, V=11, T=8, internal_norm="repbn", final_norm="repbn"), jax.random.key(0))
  flat = traverse_util.flatten_dict(v)
  for name, value in (("bn_gamma", 0.0), ("bn_beta", 0.0), ("eta", 0.0), ("mean", 0.0), ("var", 1.0)):
    leaves = [np.asarray(getattr(x, "value", x)) for k, x in flat.items() if k[-1] == name]
    assert len(leaves) == 3 and all(np.all(x == value) for x in leaves), name  # two block norms and the final


def test_lambda_is_one_through_the_warm_up_then_falls_linearly_as_the_authors_counters_do():
  cfg = base.get_config("prepbn", "size=cpu,tuned=0")
  cfg.train.steps = 40
  cfg.prepbn.update(warm_frac=0.25, blend_end=33)
  method = methods.build(cfg, ModelConfig.from_config(cfg.model), schedules.Phases.from_config(cfg))
  warm, iters, total = 10, 23, 23  # LinearNorm(warm=10, step=23): buffers decremented once per optimiser step here
  expected = []
  for _ in range(cfg.train.steps):
    if warm > 0:
      warm -= 1
      expected.append(1.0)  # the norm alone: λ = 1
    else:
      expected.append(iters / total)
      iters = max(iters - 1, 0)
  lams = [float(method.gates(jnp.int32(k)).attn[0]) for k in range(cfg.train.steps)]
  np.testing.assert_allclose(lams, expected, atol=1e-6)
  assert [bool(method.stats_active(jnp.int32(k))) for k in (9, 10)] == [False, True]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_fold_equals_the_model_at_inference(family):
  cfg = ModelConfig(
    family=family,
    V=61,
    D=32,
    H=4,
    L=2,
    T=12,
    internal_norm="repbn",
    final_norm="repbn",
    tie_embeddings=family == "llama",
  )
  leaves, tree = jax.tree.flatten(jax.tree.map(lambda x: getattr(x, "value", x), init(cfg, jax.random.key(0))))
  keys = jax.random.split(jax.random.key(1), len(leaves))
  moved = [x + 0.3 * jax.random.normal(k, x.shape) if x.dtype == jnp.float32 else x for x, k in zip(leaves, keys)]
  variables = jax.tree.unflatten(tree, moved)
  variables[CALIB] = jax.tree.map(lambda x: jnp.abs(x) + 0.5 if x.dtype == jnp.float32 else x, variables[CALIB])
  tokens_BxT = jax.random.randint(jax.random.key(2), (3, cfg.T), 0, cfg.V)
  folded, folded_cfg = fold(variables, cfg)
  assert folded_cfg.internal_norm == folded_cfg.final_norm == "identity" and folded_cfg.logits_bias
  assert folded_cfg.input_biases and "wi_0_bias" in str(folded) if family == "llama" else "wi_bias" in str(folded)
  want = Transformer(cfg).apply(variables, tokens_BxT, 0.0)
  got = Transformer(folded_cfg).apply(folded, tokens_BxT, 0.0)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(want))))


def test_inference_is_causal_and_training_mixes_rows_and_positions_through_the_batch_statistics():
  cfg = ModelConfig(V=37, D=32, H=4, L=2, T=10, internal_norm="repbn", final_norm="repbn")
  variables = jax.tree.map(lambda x: getattr(x, "value", x), init(cfg, jax.random.key(0)))
  variables["params"] = jax.tree.map(lambda x: x + 0.2, variables["params"])  # BN's affine map and η nonzero
  tokens_BxT = jax.random.randint(jax.random.key(1), (2, cfg.T), 0, cfg.V)
  later_BxT = tokens_BxT.at[:, 6:].set((tokens_BxT[:, 6:] + 1) % cfg.V)  # the same prefix, other later tokens
  model = Transformer(cfg)
  for gate in (0.0, 0.5):  # inference, and the middle of the blend at evaluation
    np.testing.assert_array_equal(
      model.apply(variables, tokens_BxT, gate)[:, :6], model.apply(variables, later_BxT, gate)[:, :6]
    )
  train = lambda t: model.apply(variables, t, 0.0, mutable=[CALIB_STATS])[0]
  assert not np.allclose(train(tokens_BxT)[:, :6], train(later_BxT)[:, :6], atol=1e-5)  # the leak in training
  row_1_changed = tokens_BxT.at[1].set((tokens_BxT[1] + 3) % cfg.V)
  assert not np.allclose(train(tokens_BxT)[0], train(row_1_changed)[0], atol=1e-5)


@pytest.mark.parametrize(
  ("variant", "overrides", "field"),
  [
    ("baseline", {"method": "prepbn"}, "model.internal_norm"),
    ("prepbn", {"method": "taper"}, "method='taper'"),
    ("prepbn", {"prepbn.warm_frac": 1.0}, "prepbn.warm_frac"),
    ("prepbn", {"prepbn.blend_end": 5}, "prepbn.blend_end"),
    ("prepbn", {"prepbn.momentum": 0.0}, "prepbn.momentum"),
    ("prepbn", {"prepbn.scale_loss_weight": -1.0}, "prepbn.scale_loss_weight"),
  ],
)
def test_bad_prepbn_configs_fail_before_compiling(variant, overrides, field):
  cfg = base.override(base.get_config(variant, "size=cpu,tuned=0"), overrides)
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    Trainer(cfg, sharding.make_mesh())


def test_a_prepbn_run_moves_its_statistics_after_the_warm_up_and_evaluates_as_its_fold():
  cfg = base.get_config("prepbn", "size=cpu,tuned=0")
  cfg.model.update(D=32, H=4, L=2, T=16, V=64)
  cfg.train.update(steps=8, batch_size=8)
  cfg.prepbn.warm_frac = 0.25
  trainer = Trainer(cfg, sharding.make_mesh())
  state = trainer.init_state(0)
  batches = [jax.random.randint(k, (8, 17), 0, 64) for k in jax.random.split(jax.random.key(3), 9)]
  for k, batch in enumerate(batches[:-1]):
    before = np.asarray(state[CALIB]["block_0"]["mlp_norm"]["var"])
    state, metrics = trainer.train_step(state, batch)
    moved = not np.array_equal(before, state[CALIB]["block_0"]["mlp_norm"]["var"])
    assert moved == (k >= 2), k  # BatchNorm takes part from the warm-up's end (step 2) on
    np.testing.assert_allclose(metrics["gate"], min(1.0, (7 - k) / 5), atol=1e-6)
  variables = {"params": state["params"], CALIB: state[CALIB]}
  folded, folded_cfg = fold(variables, trainer.model_cfg)
  inputs_BxT, targets_BxT = batches[-1][:, :-1], batches[-1][:, 1:]
  logits = Transformer(folded_cfg).apply(folded, inputs_BxT, 0.0)
  ce = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets_BxT[..., None], -1))
  np.testing.assert_allclose(trainer.eval_step(state, batches[-1]), ce, rtol=1e-4)
