"""Scanned layers (`model.scan_layers`) compute what the unrolled blocks compute — logits, the pre-logit state,
gradients and the batch statistics the norms record — for every norm form, from the same per-layer tree; each remat
policy (`model.remat`) gives the loss and gradients of none; a train step is the same either way."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from tapernorm_jax import config_fields
from tapernorm_jax.inference import forms
from tapernorm_jax.model import ModelConfig, Transformer, init, layer_scan, param_paths, sharding
from tapernorm_jax.model.config import REMAT_POLICIES
from tapernorm_jax.model.gates import Gates
from tapernorm_jax.model.norms import CALIB, CALIB_STATS
from tapernorm_jax.train import run_config
from tapernorm_jax.train.trainer import Trainer

L = 3
LAYER_GATES = Gates(  # per norm and per layer, as FakeLN's schedule moves them; the value path gated apart
  attn=jnp.array([1.0, 0.6, 0.0]),
  mlp=jnp.array([0.2, 1.0, 0.5]),
  final=jnp.float32(0.7),
  attn_value=jnp.array([0.0, 0.4, 0.9]),
)
CASES = {  # id: (family, internal norm, final norm, gate)
  "llama-plain": ("llama", "plain", "plain", 1.0),
  "gpt2-plain": ("gpt2", "plain", "plain", 1.0),
  **{f"{f}-taper-g{g}": (f, "taper", "taper", g) for f in ("llama", "gpt2") for g in (1.0, 0.3, 0.0)},
  "llama-fixed": ("llama", "fixed", "fixed", 0.0),
  "gpt2-per-layer-gates": ("gpt2", "taper", "taper", LAYER_GATES),
  "llama-per-layer-gates": ("llama", "taper", "taper", LAYER_GATES),
  "gpt2-repbn": ("gpt2", "repbn", "repbn", 0.4),
  "llama-repbn": ("llama", "repbn", "plain", 0.0),
  "llama-dyt": ("llama", "dyt", "dyt", 1.0),
  "gpt2-derf": ("gpt2", "derf", "derf", 1.0),
}


def tiny(family: str, internal: str = "taper", final: str = "taper", **changes) -> ModelConfig:
  """A three-block model of width 32."""
  return ModelConfig(family=family, V=61, D=32, H=4, L=L, T=16, internal_norm=internal, final_norm=final, **changes)


def nontrivial_variables(cfg: ModelConfig) -> dict:
  """Unboxed variables with every c, γ, γ̃, β and bias moved off its init, and RepBN's running statistics too."""
  flat = traverse_util.flatten_dict(forms.perturbed(init(cfg, jax.random.key(0)), jax.random.key(1), (0.5, 2.0)))
  keys = iter(jax.random.split(jax.random.key(2), len(flat)))
  for path in flat:
    k = next(keys)
    if path[0] == CALIB and path[-1] == param_paths.MEAN:
      flat[path] = 0.3 * jax.random.normal(k, flat[path].shape)
    elif path[0] == CALIB and path[-1] == param_paths.VAR:
      flat[path] = jax.random.uniform(k, flat[path].shape, minval=0.5, maxval=2.0)
  return traverse_util.unflatten_dict(flat)


def tokens(cfg: ModelConfig, seed: int = 3) -> jax.Array:
  return jax.random.randint(jax.random.key(seed), (2, cfg.T), 0, cfg.V)


def run(cfg: ModelConfig, variables: dict, tokens_BxT: jax.Array, gate) -> dict:
  """Evaluation outputs (logits, h: nothing recorded), and a train-mode loss with its parameter gradients and the
  batch statistics it records."""
  return program(cfg)(variables, tokens_BxT, jnp.float32(gate) if isinstance(gate, float) else gate)


@functools.cache
def program(cfg: ModelConfig):
  """`run`'s jitted computation, one compilation per config (the gate is traced: every value shares it)."""
  model = Transformer(cfg)

  def loss(params, variables, tokens_BxT, gate):
    (logits_BxTxV, h_BxTxD), stats = model.apply(
      {**variables, "params": params}, tokens_BxT, gate, return_hidden=True, mutable=[CALIB_STATS]
    )
    w_BxTxV = jnp.cos(jnp.arange(logits_BxTxV.size, dtype=jnp.float32)).reshape(logits_BxTxV.shape)
    return jnp.sum(w_BxTxV * logits_BxTxV) + jnp.sum(jnp.square(h_BxTxD)), stats[CALIB_STATS]

  def outputs(variables, tokens_BxT, gate):
    logits_BxTxV, h_BxTxD = model.apply(variables, tokens_BxT, gate, return_hidden=True)
    grad_fn = jax.value_and_grad(loss, has_aux=True)
    (value, stats), grads = grad_fn(variables["params"], variables, tokens_BxT, gate)
    return {"logits": logits_BxTxV, "hidden": h_BxTxD, "loss": value, "grads": grads, "stats": stats}

  return jax.jit(outputs)


def assert_trees_close(got, want, rtol: float = 2e-5, atol: float = 2e-6) -> None:
  """The same tree (paths), every leaf close."""
  got, want = traverse_util.flatten_dict(got, sep="/"), traverse_util.flatten_dict(want, sep="/")
  assert sorted(got) == sorted(want)
  for path in want:
    np.testing.assert_allclose(got[path], want[path], rtol=rtol, atol=atol, err_msg=path)


@pytest.mark.parametrize("family,internal,final,gate", list(CASES.values()), ids=list(CASES))
def test_scanned_blocks_compute_what_the_unrolled_blocks_compute(family, internal, final, gate):
  cfg = tiny(family, internal, final)
  variables, tokens_BxT = nontrivial_variables(cfg), tokens(cfg)
  unrolled = run(cfg, variables, tokens_BxT, gate)
  scanned = run(cfg.replace(scan_layers=True), variables, tokens_BxT, gate)
  assert_trees_close(scanned, unrolled)
  assert (param_paths.block(L - 1) in unrolled["stats"]) == (internal in ("taper", "repbn"))  # the blocks record


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("remat", [r for r in REMAT_POLICIES if r != "none"])
def test_each_remat_policy_gives_the_loss_and_gradients_of_none(remat, scan):
  cfg = tiny("gpt2", scan_layers=scan)
  variables, tokens_BxT = nontrivial_variables(cfg), tokens(cfg)
  plain = run(cfg, variables, tokens_BxT, LAYER_GATES)
  rematted = run(cfg.replace(remat=remat), variables, tokens_BxT, LAYER_GATES)
  assert_trees_close(rematted, plain)


def test_the_stored_tree_stays_per_layer():
  cfg = tiny("llama", scan_layers=True)
  variables = nn.unbox(init(cfg, jax.random.key(0)))
  assert_trees_close(variables, nn.unbox(init(cfg.replace(scan_layers=False), jax.random.key(0))), rtol=0, atol=0)
  assert {param_paths.block(i) for i in range(L)} <= set(variables["params"])


def test_the_stack_keeps_each_weights_mesh_axes_behind_an_unsharded_layer_axis():
  cfg = tiny("llama")
  mesh = sharding.make_mesh(data=2, fsdp=4)
  boxed = init(cfg, jax.random.key(0))["params"][param_paths.block(0)]
  stacked = sharding.stacked_shardings(boxed, mesh)
  per_layer = sharding.shardings(boxed, mesh)
  qkv = (param_paths.ATTN, param_paths.QKV)
  assert per_layer[qkv[0]][qkv[1]].spec == P("fsdp", None, None, None)
  assert stacked[qkv[0]][qkv[1]].spec == P(None, "fsdp", None, None, None)
  assert stacked[param_paths.ATTN_NORM][param_paths.GAMMA].spec == P(None, None)


@pytest.mark.parametrize("value", [True, False, "True", "False"])
def test_remat_keeps_its_old_bool_values(value):
  assert ModelConfig(remat=value).remat == ("full" if value in (True, "True") else "none")


@pytest.mark.parametrize("value", [True, False, "True", "False"])
def test_scan_layers_keeps_its_old_bool_values(value):
  assert ModelConfig(scan_layers=value).scanned == (value in (True, "True"))


def test_configs_written_with_bools_still_load_and_override():
  saved = config_fields.upgrade({"model": {"remat": False, "scan_layers": True, "L": 2}})
  assert ModelConfig.from_config(saved["model"]) == ModelConfig(remat="none", scan_layers="scanned", L=2)
  cfg = run_config.override(
    run_config.get_config("all_taper", "size=cpu"), {"model.remat": True, "model.scan_layers": True}
  )
  assert (cfg.model.remat, cfg.model.scan_layers) == ("full", "scanned")


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("depth", [8, 12, 48])
def test_auto_scans_on_accelerators_from_twelve_layers(platform, depth):
  assert ModelConfig(L=depth, platform=platform).scanned == (platform != "cpu" and depth >= 12)
  assert ModelConfig(L=depth, platform=platform, scan_layers="unrolled").scanned is False


def test_the_deep_presets_scan_for_a_tpu_mesh_and_the_tinystories_ones_do_not():
  deep, shallow = run_config.get_config("all_taper", "size=1b"), run_config.get_config("all_taper", "size=30m")
  assert ModelConfig.from_config(deep.model).for_platform("tpu").scanned
  assert not ModelConfig.from_config(shallow.model).for_platform("tpu").scanned
  assert not ModelConfig.from_config(deep.model).for_platform("cpu").scanned


def test_a_bad_scan_choice_is_named_with_the_accepted_ones():
  with pytest.raises(ValueError, match=r"^model\.scan_layers='yes': choose one of \('auto', 'scanned', 'unrolled'\)"):
    ModelConfig(scan_layers="yes")


def test_a_bad_remat_policy_is_named_with_the_accepted_ones():
  with pytest.raises(ValueError, match=r"^model\.remat='fast': choose one of \('none', 'full', 'save_matmuls'\)"):
    ModelConfig(remat="fast")


@pytest.mark.parametrize("variant", ["all_taper", "fakeln"])
def test_train_steps_are_the_same_scanned_and_unrolled(variant):
  """A scanned run keeps its parameters and Adam's moments stacked (weight decay on matrices only, gradient norms per
  weight type, the calibration writing each block's norms): three steps across its first calibration leave the
  parameters, optimiser state, calibration constants and metrics of the unrolled run."""
  outs = {}
  for scan in (False, True):
    cfg = run_config.get_config(variant, "size=cpu")
    cfg.model.scan_layers = "scanned" if scan else "unrolled"
    cfg.train.batch_size = 8
    cfg.opt.weight_decay = 0.1
    trainer = Trainer(cfg, sharding.make_mesh(data=2, fsdp=4))
    state = trainer.init_state(0)
    assert (layer_scan.STACKED in state["params"]) == scan
    first = min(trainer.method.removal.values()) if variant == "fakeln" else trainer.phases.taper_start
    state["step"] = jax.device_put(np.int32(first - 1), state["step"].sharding)  # steps first − 1, first, first + 1
    for step in range(3):
      batch_BxT1 = jax.random.randint(jax.random.key(step), (8, cfg.model.T + 1), 0, cfg.model.V)
      state, metrics = trainer.train_step(state, jax.device_put(batch_BxT1, trainer.batch_sharding))
    outs[scan] = jax.device_get((trainer.per_layer(state), metrics))
  fresh_c = c_values(jax.device_get(trainer.init_state(0)["calib"]))
  (state_s, metrics_s), (state_u, metrics_u) = outs[True], outs[False]
  assert jax.tree.structure(state_s) == jax.tree.structure(state_u)
  assert set(metrics_s) == set(metrics_u) and any(name.startswith("grad_norm/") for name in metrics_s)
  for name in metrics_u:
    np.testing.assert_allclose(metrics_s[name], metrics_u[name], rtol=1e-5, err_msg=name)
  assert_trees_close(state_s["params"], state_u["params"], rtol=1e-5, atol=1e-6)
  assert_trees_close(state_s["calib"], state_u["calib"], rtol=1e-5, atol=1e-6)
  assert any(np.any(a != b) for a, b in zip(c_values(state_u["calib"]), fresh_c))  # a calibration happened
  for got, want in zip(jax.tree.leaves(state_s["opt_state"]), jax.tree.leaves(state_u["opt_state"])):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-9)


def c_values(calib) -> list[np.ndarray]:
  """Every norm's calibration constant c in `calib`."""
  return [np.asarray(x) for path, x in traverse_util.flatten_dict(calib).items() if path[-1] == param_paths.C]


def test_stacking_blocks_is_undone_in_any_tree_that_holds_them():
  """`stack_blocks` puts block i's leaves at index i of the layer axis wherever a dict holds the blocks (here inside
  an Adam state), leaves the rest alone, and `unstack_blocks` gives back the tree it started from."""
  L = 3
  params = {
    "embed": jnp.ones((5, 2)),
    **{param_paths.block(i): {"w": jnp.full((2, 2), float(i)), "g": jnp.arange(2.0) + i} for i in range(L)},
  }
  opt_state = optax.adam(1e-3).init(params)
  stacked = layer_scan.stack_blocks((params, opt_state), L)
  assert set(stacked[0]) == {"embed", layer_scan.STACKED}
  np.testing.assert_array_equal(stacked[0][layer_scan.STACKED]["g"], [[0, 1], [1, 2], [2, 3]])
  assert stacked[1][0].mu[layer_scan.STACKED]["w"].shape == (L, 2, 2)
  back = layer_scan.unstack_blocks(stacked, L)
  assert jax.tree.structure(back) == jax.tree.structure((params, opt_state))
  for got, want in zip(jax.tree.leaves(back), jax.tree.leaves((params, opt_state))):
    np.testing.assert_array_equal(got, want)
  paths = jax.tree_util.tree_flatten_with_path(stacked[0])[0]
  assert {jax.tree_util.keystr(p): layer_scan.layer_ndim(p, x) for p, x in paths} == {
    "['blocks']['g']": 1,
    "['blocks']['w']": 2,
    "['embed']": 2,
  }


def test_the_stacked_placement_is_block_zeros_behind_an_unsharded_layer_axis():
  mesh = sharding.make_mesh(data=2, fsdp=4)
  cfg = ModelConfig(L=2, D=64, H=4, V=128, T=16)
  placement = sharding.shardings(Transformer(cfg).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)), mesh)
  stacked = layer_scan.stacked_placement(placement, cfg.L)["params"]
  block0 = traverse_util.flatten_dict(placement["params"][param_paths.block(0)])
  assert {k: s.spec for k, s in traverse_util.flatten_dict(stacked[layer_scan.STACKED]).items()} == {
    k: P(None, *s.spec) for k, s in block0.items()
  }
  assert param_paths.block(0) not in stacked and stacked["embed"] == placement["params"]["embed"]
