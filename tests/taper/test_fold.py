"""Fold: the folded model computes the g = 0 forward of the original, in fp32, fp64, bf16 and sharded."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tapernorm_jax.inference import forms
from tapernorm_jax.model import ModelConfig, Transformer, sharding
from tapernorm_jax.taper.fold import fold, fold_linear, norm_map
from tapernorm_jax.taper.losses import cross_entropy
from model_helpers import init_variables, logits_at

FAMILIES = ("llama", "gpt2")
VARIANTS = {  # name: (internal norm, final norm, extra config)
  "internal_taper": ("taper", "plain", {}),
  "final_taper": ("plain", "taper", {}),
  "all_taper": ("taper", "taper", {}),
  "all_fixed": ("fixed", "fixed", {}),
  "all_taper_untied": ("taper", "taper", dict(tie_embeddings=False)),
  "all_taper_untied_bias": ("taper", "taper", dict(tie_embeddings=False, logits_bias=True)),
}


def _cfg(family: str, variant: str, **changes) -> ModelConfig:
  internal, final, extra = VARIANTS[variant]
  base = dict(family=family, V=97, D=32, H=4, L=2, T=16, internal_norm=internal, final_norm=final, **extra)
  return ModelConfig(**{**base, **changes})


def perturbed(variables, seed: int = 1):
  """Unboxed variables with non-trivial γ, γ̃, β, biases and c, so that every part of the fold matters."""
  return forms.perturbed(variables, jax.random.key(seed), c_range=(0.3, 3.0), spread=0.3)


def _tokens(cfg: ModelConfig, shape=(3, 16), seed: int = 2) -> jax.Array:
  return jax.random.randint(jax.random.key(seed), shape, 0, cfg.V)


def _rel_err(a: jax.Array, b: jax.Array) -> float:
  """max |a − b| / max |a|."""
  return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a)))


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("family", FAMILIES)
def test_folded_fp32_logits_equal_the_unfolded_model_at_gate_zero(family, variant):
  cfg = _cfg(family, variant)
  variables = perturbed(init_variables(cfg))
  tokens = _tokens(cfg)
  expected = logits_at(cfg, variables, tokens, 0.0)
  folded, folded_cfg = fold(variables, cfg)
  folded_logits = logits_at(folded_cfg, folded, tokens, 0.7)  # the gate no longer matters
  assert _rel_err(expected, folded_logits) < 1e-5
  tapered = [n for n in ("internal_norm", "final_norm") if getattr(cfg, n) != "plain"]
  assert all(getattr(folded_cfg, n) == "identity" for n in tapered)
  assert all(getattr(folded_cfg, n) == "plain" for n in ("internal_norm", "final_norm") if n not in tapered)
  if cfg.final_norm != "plain":
    assert not folded_cfg.tie_embeddings and folded["params"]["head"].shape == (cfg.D, cfg.V)
    assert folded_cfg.logits_bias == (family == "gpt2" or cfg.logits_bias)


@pytest.mark.parametrize("family", FAMILIES)
def test_folded_weights_keep_their_shapes_dtypes_and_logical_axes(family):
  cfg = _cfg(family, "all_taper")
  boxed = init_variables(cfg)
  folded, folded_cfg = fold(boxed, cfg)
  before = nn.get_partition_spec(boxed)["params"]
  after = nn.get_partition_spec(folded)["params"]
  for i in range(cfg.L):
    names = ["qkv"] + (["qkv_bias"] if family == "gpt2" else [])
    for name in names:
      assert after[f"block_{i}"]["attn"][name] == before[f"block_{i}"]["attn"][name]
    assert "attn_norm" not in after[f"block_{i}"] and "mlp_norm" not in after[f"block_{i}"]
  assert tuple(after["head"]) == ("embed", "vocab")
  shapes = lambda v: jax.tree.map(lambda x: (x.shape, x.dtype), nn.unbox(v)["params"]["block_0"]["mlp"])
  assert shapes(folded) == shapes(boxed)
  unboxed = nn.unbox(folded)
  assert set(unboxed["calib"]) == {"pre_logit"}  # folded layers leave no calibration state behind


def test_fold_is_pure_and_jittable():
  cfg = _cfg("gpt2", "all_taper")
  variables = perturbed(init_variables(cfg))
  snapshot = jax.tree.map(np.asarray, variables)
  folded, folded_cfg = fold(variables, cfg)
  jax.tree.map(np.testing.assert_array_equal, variables, snapshot)
  jitted = jax.jit(lambda v: fold(v, cfg)[0])(variables)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), jitted, folded)


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_fold_linear_is_exactly_A_W_in_float64(kind):
  with jax.enable_x64(True):
    D, k = 16, jax.random.split(jax.random.key(0), 4)
    gamma_tilde, beta = 1 + jax.random.normal(k[0], (D,), jnp.float64), jax.random.normal(k[1], (D,), jnp.float64)
    w_Dx3x2x5, b_3x2x5 = (
      jax.random.normal(k[2], (D, 3, 2, 5), jnp.float64),
      jax.random.normal(k[3], (3, 2, 5), jnp.float64),
    )
    params = {"gamma_tilde": gamma_tilde, "beta": beta}
    row_scale, beta_D = norm_map(params, jnp.float64(0.37), kind)
    w_new, b_new = fold_linear(w_Dx3x2x5, b_3x2x5, row_scale, beta_D, center=kind == "ln")
    center = jnp.eye(D) - jnp.ones((D, D)) / D if kind == "ln" else jnp.eye(D)
    A_DxD = 0.37 * center @ jnp.diag(gamma_tilde)
    np.testing.assert_allclose(w_new, jnp.einsum("de,ethk->dthk", A_DxD, w_Dx3x2x5), rtol=1e-12, atol=1e-13)
    want_b = b_3x2x5 + jnp.einsum("d,dthk->thk", beta, w_Dx3x2x5) if kind == "ln" else b_3x2x5
    np.testing.assert_allclose(b_new, want_b, rtol=1e-12, atol=1e-13)
    assert w_new.dtype == jnp.float64


@pytest.mark.parametrize("family", FAMILIES)
def test_folded_fp64_logits_equal_the_unfolded_model_to_1e_12(family):
  cfg32 = _cfg(family, "all_taper")
  variables32 = perturbed(init_variables(cfg32))
  with jax.enable_x64(True):
    cfg = cfg32.replace(dtype="float64", param_dtype="float64")
    variables = jax.tree.map(lambda x: x.astype(jnp.float64) if x.dtype == jnp.float32 else x, variables32)
    tokens = _tokens(cfg)
    folded, folded_cfg = fold(variables, cfg)
    logits = logits_at(folded_cfg, folded, tokens)
    assert logits.dtype == jnp.float64
    assert _rel_err(logits_at(cfg, variables, tokens, 0.0), logits) < 1e-12


def _trained_bigram_model(cfg: ModelConfig, steps: int = 100):
  """A small model trained at g = 0 on a permutation bigram task, so its top-1 margins are realistic."""
  variables = perturbed(init_variables(cfg), seed=3)
  perm = np.random.default_rng(0).permutation(cfg.V)
  rows = [np.arange(cfg.V)]
  for _ in range(cfg.T // 2):
    rows.append(perm[rows[-1]])
  tokens_BxT = jnp.asarray(np.stack(rows, 1))
  model, tx = Transformer(cfg.replace(dtype="float32")), optax.adam(1e-2)
  loss_fn = lambda p: cross_entropy(
    model.apply({"params": p, "calib": variables["calib"]}, tokens_BxT[:, :-1], gate=0.0), tokens_BxT[:, 1:]
  )

  def step(carry, _):
    params, opt = carry
    updates, opt = tx.update(jax.grad(loss_fn)(params), opt)
    return (optax.apply_updates(params, updates), opt), None

  (params, _), _ = jax.jit(lambda p: jax.lax.scan(step, (p, tx.init(p)), None, steps))(variables["params"])
  return {"params": params, "calib": variables["calib"]}, tokens_BxT


def _check_bf16_top1(family: str, variant: str) -> None:
  """The fold adds no more top-1 error than bf16 rounding itself: the folded bf16 model's top-1 tokens disagree with
  the fp32 model's on at most 0.1% of positions, or, where bf16 alone moves more than that (positions whose fp32
  margin is within the rounding), on at most three times the unfolded bf16 model's share: the folded model rounds
  the activations its own way and also its folded weights (c·γ̃ merged into the next projection, stored in bf16)."""
  cfg = _cfg(family, variant, V=64, T=32, dtype="bfloat16")
  variables, tokens = _trained_bigram_model(cfg)
  folded, folded_cfg = fold(variables, cfg)
  top1_fp32 = jnp.argmax(logits_at(cfg.replace(dtype="float32"), variables, tokens, 0.0), -1)
  rounding = 1.0 - float(jnp.mean(jnp.argmax(logits_at(cfg, variables, tokens, 0.0), -1) == top1_fp32))
  folded_error = 1.0 - float(jnp.mean(jnp.argmax(logits_at(folded_cfg, folded, tokens), -1) == top1_fp32))
  assert top1_fp32.size >= 1000 and folded_error <= max(0.001, 3 * rounding), (folded_error, rounding)


def test_bf16_top1_tokens_agree_on_999_per_mille_of_positions():
  _check_bf16_top1("llama", "all_taper")


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["internal_taper", "final_taper", "all_taper", "all_taper_untied_bias"])
@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_top1_agreement_for_every_variant(family, variant):
  _check_bf16_top1(family, variant)


@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_params_fold_in_place(family):
  cfg = _cfg(family, "all_taper")
  n = jax.device_count()  # 8 on the fake CPU devices (conftest.py)
  if cfg.D % n:
    pytest.skip(f"{n} devices: D={cfg.D} does not split over fsdp={n}")
  mesh = sharding.make_mesh(data=1, fsdp=n)
  boxed = init_variables(cfg)
  variables = perturbed(boxed)
  placed = jax.device_put(variables, sharding.shardings(boxed, mesh))
  folded, folded_cfg = fold(placed, cfg)
  qkv_in, qkv_out = placed["params"]["block_0"]["attn"]["qkv"], folded["params"]["block_0"]["attn"]["qkv"]
  assert qkv_out.sharding == qkv_in.sharding and qkv_out.sharding.spec[0] == "fsdp"
  assert folded["params"]["head"].sharding.spec == jax.sharding.PartitionSpec("fsdp", None)
  tokens = jax.device_put(_tokens(cfg, (n * max(1, 8 // n), 16)), sharding.batch_sharding(mesh))
  logits = logits_at(folded_cfg, folded, tokens)
  assert _rel_err(logits_at(cfg, variables, np.asarray(tokens), 0.0), logits) < 1e-5


def test_baseline_model_is_a_clear_error():
  cfg = _cfg("llama", "all_taper", internal_norm="plain", final_norm="plain")
  with pytest.raises(ValueError, match="nothing to fold.*internal_norm='plain'"):
    fold(init_variables(cfg), cfg)


@pytest.mark.parametrize(
  "changes,message",
  [
    (dict(D=64), r"params/block_0/attn/qkv has shape \(32, 3, 4, 8\), the model expects \(64, 3, 4, 16\)"),
    (dict(family="gpt2"), r"params/block_0/attn/qkv_bias missing"),
    (dict(L=3), r"params/block_2/attn/qkv missing"),
    (dict(internal_norm="plain"), r"params/block_0/attn_norm/gamma_tilde is not in the model"),
    (dict(tie_embeddings=False), r"params/head missing"),
  ],
)
def test_config_that_does_not_match_the_variables_is_a_clear_error(changes, message):
  cfg = _cfg("llama", "all_taper")
  with pytest.raises(ValueError, match="do not match the model config.*" + message):
    fold(init_variables(cfg), cfg.replace(**changes))


def test_missing_calibration_collection_is_named():
  cfg = _cfg("llama", "all_taper")
  with pytest.raises(ValueError, match="calib"):
    fold({"params": nn.unbox(init_variables(cfg))["params"]}, cfg)
