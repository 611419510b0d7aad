"""The transformer: API, causality, the paper's parameter counts, gate handling and config errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax import traverse_util

from tapernorm_jax.model import ModelConfig, Transformer, abstract_variables, init, param_count, param_paths

LLAMA = ModelConfig(V=97, D=32, H=4, L=2, T=16, internal_norm="taper", final_norm="taper")
GPT2 = ModelConfig(family="gpt2", V=97, D=32, H=4, L=2, T=16, internal_norm="taper", final_norm="taper")


def _tokens(seed: int = 0, shape=(2, 12), V: int = 97) -> jax.Array:
  return jax.random.randint(jax.random.key(seed), shape, 0, V)


@pytest.mark.parametrize("cfg", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_apply_returns_logits_and_the_pre_logit_state(cfg):
  variables = init(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg, jax.random.key(0))
  tokens = _tokens()
  logits = Transformer(cfg).apply(variables, tokens, gate=0.5)
  assert logits.shape == (2, 12, cfg.V) and logits.dtype == jnp.float32
  logits2, h = Transformer(cfg).apply(variables, tokens, gate=0.5, return_hidden=True)
  assert h.shape == (2, 12, cfg.D)
  np.testing.assert_array_equal(logits, logits2)
  np.testing.assert_allclose(Transformer(cfg).apply(variables, h, 0.5, method=Transformer.logits), logits, rtol=1e-6)


@pytest.mark.parametrize("cfg", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_logits_at_t_do_not_depend_on_later_tokens(cfg):
  variables = init(cfg, jax.random.key(1))
  tokens = _tokens(1)
  changed = tokens.at[:, 7:].set((tokens[:, 7:] + 5) % cfg.V)
  a = Transformer(cfg).apply(variables, tokens, gate=0.3)
  b = Transformer(cfg).apply(variables, changed, gate=0.3)
  np.testing.assert_allclose(a[:, :7], b[:, :7], rtol=1e-6, atol=1e-6)
  assert not np.allclose(a[:, 7:], b[:, 7:])


def test_causality_by_gradients():
  variables = init(LLAMA, jax.random.key(2))
  embed = nn.unbox(variables)["params"]["embed"]
  tokens = _tokens(2, (1, 10))

  def logit_sum_at(t, x_1xLxD):
    params = dict(nn.unbox(variables)["params"])
    return jnp.sum(_forward_from_embeddings(params, x_1xLxD)[0, t])

  x = jnp.take(embed, tokens, axis=0)
  grad = jax.grad(logit_sum_at, argnums=1)(4, x)
  assert float(jnp.abs(grad[0, 5:]).max()) == 0.0
  assert float(jnp.abs(grad[0, :5]).max()) > 0.0


def _forward_from_embeddings(params, x_BxTxD):
  """Runs the blocks and head on given input embeddings (a second entry point for the gradient check)."""
  model = Transformer(LLAMA)
  variables = {"params": params, "calib": init(LLAMA, jax.random.key(2))["calib"]}

  def run(module, x):
    positions = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
    h = x
    for block in module.blocks:
      h = block(h, positions, jnp.full((2,), 0.5, jnp.float32))
    return module.logits(h, 0.5)

  return model.apply(variables, x_BxTxD, method=run)


@pytest.mark.parametrize("D,expected", [(64, 1.03e6), (128, 2.85e6), (256, 8.85e6), (512, 30.3e6)])
def test_paper_parameter_counts(D, expected):
  cfg = ModelConfig(D=D, H=16, L=8, V=10_000)
  shapes = jax.eval_shape(lambda: init(cfg, jax.random.key(0)))
  assert abs(param_count(shapes["params"]) / expected - 1) < 0.05


def test_one_compilation_serves_every_gate_value():
  variables = init(LLAMA, jax.random.key(0))
  fn = jax.jit(lambda v, t, g: Transformer(LLAMA).apply(v, t, gate=g))
  tokens = _tokens()
  outs = [fn(variables, tokens, jnp.float32(g)) for g in (1.0, 0.6, 0.0)]
  assert fn._cache_size() == 1
  assert not np.allclose(outs[0], outs[2])


def test_fixed_form_equals_taper_at_gate_zero():
  variables = nn.unbox(init(LLAMA, jax.random.key(4)))
  tokens = _tokens(4)
  fixed_cfg = LLAMA.replace(internal_norm="fixed", final_norm="fixed")
  np.testing.assert_allclose(Transformer(fixed_cfg).apply(variables, tokens),
                             Transformer(LLAMA).apply(variables, tokens, gate=0.0), rtol=1e-5, atol=1e-6)


def test_every_parameter_has_logical_axes():
  variables = init(GPT2, jax.random.key(0))
  specs = nn.get_partition_spec(variables)["params"]
  shapes = jax.tree.map(lambda x: x.shape, nn.unbox(variables)["params"])
  for spec, shape in zip(jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)),
                         jax.tree.leaves(shapes, is_leaf=lambda x: isinstance(x, tuple))):
    assert len(spec) == len(shape)
  assert tuple(specs["embed"]) == ("vocab", "embed")


def test_bf16_compute_keeps_fp32_logits():
  cfg = LLAMA.replace(dtype="bfloat16")
  logits = Transformer(cfg).apply(init(cfg, jax.random.key(0)), _tokens())
  assert logits.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(logits)))


@pytest.mark.parametrize("changes,field", [
    (dict(D=64, H=5), "model.H"),
    (dict(internal_norm="batchnorm"), "model.internal_norm"),
    (dict(final_norm="rms"), "model.final_norm"),
    (dict(eps=-1e-5), "model.eps"),
    (dict(family="bert"), "model.family"),
    (dict(D=30, H=10), "model.H"),  # odd head dim for RoPE
    (dict(logits_bias=True), "model.logits_bias"),
])
def test_bad_configs_raise_before_compiling(changes, field):
  base = dict(V=97, D=32, H=4, L=2, T=16)
  base.update(changes)
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    Transformer(base)  # raised at construction: nothing is traced or compiled


def test_unknown_config_field_is_named():
  with pytest.raises(ValueError, match="heads"):
    Transformer(dict(V=97, D=32, heads=4))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("internal,final", [("plain", "plain"), ("taper", "plain"), ("fixed", "taper")])
def test_layout_names_every_variable_the_model_makes(family, internal, final):
  cfg = ModelConfig(family=family, V=50, D=16, H=2, L=3, T=8, internal_norm=internal, final_norm=final)
  variables = nn.unbox(abstract_variables(cfg))
  params = set(traverse_util.flatten_dict(variables["params"]))
  calib = set(traverse_util.flatten_dict(variables["calib"]))
  for per_block in param_paths.weight_paths(cfg).values():
    assert len(per_block) == cfg.L and all(path in params for paths in per_block for path in paths)
  sites = param_paths.norm_sites(cfg)
  assert len(sites) == 2 * cfg.L + 1
  norm_params = {(param_paths.GAMMA,), (param_paths.GAMMA_TILDE,), (param_paths.BETA,)}
  for site in sites:
    assert all(w in params for w in site.weights if w != (param_paths.HEAD,))
    assert (site.norm + (param_paths.GAMMA,)) in params
  scalars = (param_paths.NUM, param_paths.DEN, param_paths.S, param_paths.COUNT, param_paths.C)
  expected_calib = {n + (k,) for n in param_paths.norms_in(cfg) for k in scalars}
  expected_calib |= {(param_paths.PRE_LOGIT, k) for k in (param_paths.S, param_paths.COUNT, param_paths.S_TGT)}
  assert calib == expected_calib
  tapered = set(param_paths.norms_in(cfg))
  for site in sites:  # γ̃ exactly where a norm is calibrated, β exactly for LN
    keys = {p[len(site.norm):] for p in params if p[:len(site.norm)] == site.norm}
    assert keys <= norm_params
    assert ((param_paths.GAMMA_TILDE,) in keys) == (site.norm in tapered)
    assert ((param_paths.BETA,) in keys) == (family == "gpt2")
