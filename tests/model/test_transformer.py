"""The transformer: API, causality, the paper's parameter counts, gate handling and config errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax import traverse_util

from tapernorm_jax.model import ModelConfig, Transformer, abstract_variables, init, param_count, param_paths
from tapernorm_jax.model.gates import BlockGates, Gates
from tapernorm_jax.model.norms import Norm

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
      h = block(h, positions, BlockGates(attn=jnp.float32(0.5), mlp=jnp.float32(0.5)))
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


def norm_gates_seen(cfg: ModelConfig, variables, tokens, gate) -> dict[str, tuple[float, ...]]:
  """The gate(s) each Norm call received, by module path (flax method interception: the model's own routing)."""
  seen = {}

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, Norm) and context.method_name == "__call__":
      seen["/".join(context.module.path)] = tuple(float(g) for g in args[1:])
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    Transformer(cfg).apply(variables, tokens, gate)
  return seen


@pytest.mark.parametrize("with_value", [False, True])
def test_each_norm_reads_its_own_gate_by_name(with_value):
  variables = init(GPT2, jax.random.key(0))
  gates = Gates(
    attn=jnp.array([0.1, 0.2]),
    mlp=jnp.array([0.3, 0.4]),
    final=jnp.float32(0.5),
    attn_value=jnp.array([0.6, 0.7]) if with_value else None,
  )
  seen = norm_gates_seen(GPT2, variables, _tokens(), gates)
  value = lambda i: (float(gates.attn_value[i]),) if with_value else ()
  expected = {
    **{f"block_{i}/attn_norm": (float(gates.attn[i]), *value(i)) for i in range(2)},
    **{f"block_{i}/mlp_norm": (float(gates.mlp[i]),) for i in range(2)},
    "final_norm": (0.5,),
  }
  assert {k: tuple(round(g, 6) for g in v) for k, v in seen.items()} == {
    k: tuple(round(g, 6) for g in v) for k, v in expected.items()
  }
  uniform = norm_gates_seen(GPT2, variables, _tokens(), 0.25)
  assert set(uniform.values()) == {(0.25,)} and set(uniform) == set(expected)


@pytest.mark.parametrize(
  "gates, message",
  [
    (
      Gates(attn=jnp.ones(3), mlp=jnp.ones(2), final=jnp.float32(1)),
      r"gates.attn has shape \(3,\); a model of "
      r"model.L=2 blocks takes shape \(2,\)",
    ),
    (Gates(attn=jnp.ones(2), mlp=jnp.ones(2), final=jnp.ones(2)), r"gates.final has shape \(2,\)"),
    (Gates(attn=jnp.ones(2), mlp=jnp.array([1.0, 1.5]), final=jnp.float32(1)), r"must lie in \[0, 1\]"),
    (jnp.ones(5), r"gate has shape \(5,\); give a scalar .* or a tapernorm_jax.model.gates.Gates"),
  ],
)
def test_gates_of_another_shape_or_range_are_refused_by_field(gates, message):
  with pytest.raises(ValueError, match=message):
    Transformer(LLAMA).apply(init(LLAMA, jax.random.key(0)), _tokens(), gates)


def test_fixed_form_equals_taper_at_gate_zero():
  variables = nn.unbox(init(LLAMA, jax.random.key(4)))
  tokens = _tokens(4)
  fixed_cfg = LLAMA.replace(internal_norm="fixed", final_norm="fixed")
  np.testing.assert_allclose(
    Transformer(fixed_cfg).apply(variables, tokens),
    Transformer(LLAMA).apply(variables, tokens, gate=0.0),
    rtol=1e-5,
    atol=1e-6,
  )


def test_every_parameter_has_logical_axes():
  variables = init(GPT2, jax.random.key(0))
  specs = nn.get_partition_spec(variables)["params"]
  shapes = jax.tree.map(lambda x: x.shape, nn.unbox(variables)["params"])
  for spec, shape in zip(
    jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)),
    jax.tree.leaves(shapes, is_leaf=lambda x: isinstance(x, tuple)),
  ):
    assert len(spec) == len(shape)
  assert tuple(specs["embed"]) == ("vocab", "embed")


def test_bf16_compute_keeps_fp32_logits():
  cfg = LLAMA.replace(dtype="bfloat16")
  logits = Transformer(cfg).apply(init(cfg, jax.random.key(0)), _tokens())
  assert logits.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(logits)))


@pytest.mark.parametrize(
  "changes,field",
  [
    (dict(D=64, H=5), "model.H"),
    (dict(internal_norm="batchnorm"), "model.internal_norm"),
    (dict(final_norm="rms"), "model.final_norm"),
    (dict(eps=-1e-5), "model.eps"),
    (dict(family="bert"), "model.family"),
    (dict(D=30, H=10), "model.H"),  # odd head dim for RoPE
    (dict(logits_bias=True), "model.logits_bias"),
    (dict(norm_gain_init=0.0), "model.norm_gain_init"),
    (dict(final_norm_gain_init=-1.0), "model.final_norm_gain_init"),
    (dict(repbn_gain_init=-1.0), "model.repbn_gain_init"),
  ],
)
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
    keys = {p[len(site.norm) :] for p in params if p[: len(site.norm)] == site.norm}
    assert keys <= norm_params
    assert ((param_paths.GAMMA_TILDE,) in keys) == (site.norm in tapered)
    assert ((param_paths.BETA,) in keys) == (family == "gpt2")


@pytest.mark.parametrize("mode, alphas", [("dyt", (0.8, 0.2, 0.2)), ("derf", (1.0, 1.0, 1.0))])
def test_pointwise_norms_start_from_their_authors_alphas_and_scale_the_embeddings(mode, alphas):
  cfg = LLAMA.replace(internal_norm=mode, final_norm=mode)
  params = nn.unbox(init(cfg, jax.random.key(0)))["params"]
  assert float(params["embed_scale"]) == pytest.approx(cfg.D**0.5)  # DyT's and Derf's LMs: a learned √D
  assert [float(params["block_1"][n]["alpha"]) for n in ("attn_norm", "mlp_norm")] + [
    float(params["final_norm"]["alpha"])
  ] == pytest.approx(list(alphas))
  chosen = nn.unbox(init(cfg.replace(norm_alpha=(0.5, 0.4, 0.3)), jax.random.key(0)))["params"]
  assert float(chosen["block_0"]["mlp_norm"]["alpha"]) == pytest.approx(0.4)
  tokens = _tokens()  # the embeddings scaled, then the blocks: doubling the scale is the same as doubling the table
  doubled = {**params, "embed_scale": 2 * params["embed_scale"]}
  twice_table = {**params, "embed": 2 * params["embed"]}
  calib = init(cfg, jax.random.key(0))["calib"]
  hidden = lambda p: Transformer(cfg).apply({"params": p, "calib": calib}, tokens, method=Transformer.hidden)
  np.testing.assert_allclose(hidden(doubled), hidden(twice_table), rtol=1e-5, atol=1e-5)
  assert "embed_scale" not in nn.unbox(init(LLAMA, jax.random.key(0)))["params"]


@pytest.mark.parametrize("alphas", [(0.5, 0.5), (0.5, -1.0, 0.5)])
def test_a_bad_norm_alpha_is_named(alphas):
  with pytest.raises(ValueError, match=r"model.norm_alpha=.*give three values > 0"):
    LLAMA.replace(internal_norm="dyt", norm_alpha=alphas)


@pytest.mark.parametrize("internal,final", [("plain", "plain"), ("taper", "taper"), ("dyt", "dyt")])
def test_norm_gain_init_starts_every_gain_there_as_scaling_the_gains_by_hand_does(internal, final):
  cfg = LLAMA.replace(internal_norm=internal, final_norm=final)
  base = nn.unbox(init(cfg, jax.random.key(0)))
  five = nn.unbox(init(cfg.replace(norm_gain_init=5.0), jax.random.key(0)))
  by_hand = traverse_util.unflatten_dict(
    {k: 5 * v if k[-1] == param_paths.GAMMA else v for k, v in traverse_util.flatten_dict(base["params"]).items()}
  )
  flat = traverse_util.flatten_dict(five["params"])
  assert sum(k[-1] == param_paths.GAMMA for k in flat) == 2 * cfg.L + 1  # every norm's γ, γ̃ left at 1
  assert all(np.all(v == 1.0) for k, v in flat.items() if k[-1] == param_paths.GAMMA_TILDE)
  tokens = _tokens()
  logits = lambda c, v: Transformer(c).apply(v, tokens, gate=1.0)
  np.testing.assert_allclose(
    logits(cfg.replace(norm_gain_init=5.0), five), logits(cfg, {**base, "params": by_hand}), rtol=1e-5, atol=1e-5
  )
  assert not np.allclose(logits(cfg, base), logits(cfg, {**base, "params": by_hand}), atol=1e-3)


@pytest.mark.parametrize(
  "mode, changes",
  [
    ("plain", dict(norm_gain_init=3.0, final_norm_gain_init=5.0, init_std=0.05)),
    ("dyt", dict(norm_alpha=(4.0, 1.0, 1.0))),
    ("derf", dict(derf_shift=0.5)),
  ],
)
def test_fields_that_set_initial_values_change_no_program_and_share_one_program_key(mode, changes):
  base = LLAMA.replace(internal_norm=mode, final_norm=mode)
  other = base.replace(**changes)
  tokens = _tokens()
  hlo = [
    jax.jit(lambda v, t, c=c: Transformer(c).apply(v, t)).lower(abstract_variables(c), tokens).as_text()
    for c in (base, other)
  ]
  assert hlo[0] == hlo[1] and base.program_key() == other.program_key() and base != other
  assert base.program_key() != base.replace(D=64, H=4).program_key()  # a field the program reads keeps its place


def test_repbn_gain_init_starts_only_batchnorms_weight_there_and_repbn_is_then_that_times_bn():
  cfg = LLAMA.replace(internal_norm="repbn", final_norm="repbn")
  base = nn.unbox(init(cfg, jax.random.key(0)))
  three = nn.unbox(init(cfg.replace(repbn_gain_init=3.0), jax.random.key(0)))
  by_hand = {
    path: (np.full_like(v, 3.0) if path[-1] == param_paths.BN_GAMMA else v)
    for path, v in traverse_util.flatten_dict(base["params"]).items()
  }
  assert sum(path[-1] == param_paths.BN_GAMMA for path in by_hand) == 2 * cfg.L + 1
  assert jax.tree.all(jax.tree.map(np.array_equal, three["params"], traverse_util.unflatten_dict(by_hand)))
  # at λ = 0 with η = 0, β = 0 and the initial statistics (mean 0, variance 1), each norm is 3·x/√(1 + ε)
  x = jax.random.normal(jax.random.key(1), (2, 5, cfg.D))
  norm = Norm("rms", "repbn", cfg.eps, bn_gain_init=3.0)
  variables = norm.init(jax.random.key(0), x, 0.0)
  np.testing.assert_allclose(norm.apply(variables, x, 0.0), 3 * x / np.sqrt(1 + cfg.eps), rtol=1e-6)


@pytest.mark.parametrize("internal,final", [("plain", "plain"), ("taper", "taper")])
def test_final_norm_gain_init_starts_only_the_final_gamma_there(internal, final):
  cfg = LLAMA.replace(internal_norm=internal, final_norm=final)
  base = nn.unbox(init(cfg, jax.random.key(0)))
  five = nn.unbox(init(cfg.replace(final_norm_gain_init=5.0), jax.random.key(0)))
  by_hand = traverse_util.flatten_dict(base["params"])
  by_hand[(param_paths.FINAL_NORM, param_paths.GAMMA)] = 5 * by_hand[(param_paths.FINAL_NORM, param_paths.GAMMA)]
  by_hand = traverse_util.unflatten_dict(by_hand)
  assert jax.tree.all(jax.tree.map(np.array_equal, five["params"], by_hand))
  tokens = _tokens()
  logits = lambda c, v: Transformer(c).apply(v, tokens, gate=1.0)
  assert not np.allclose(logits(cfg, base), logits(cfg, five), atol=1e-3)
