"""Every attention implementation against the `xla` reference (outputs, gradients, the causal mask, ragged
prefills), the last-token forward against the full forward, and `auto`'s choice per backend (docs/method.md §13)."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tapernorm_jax.inference import decode, forms
from tapernorm_jax.model import ModelConfig, Transformer, attention, init, sharding

HERE = sharding.platform_of(None)  # the platform these tests run on (the target of every call below)


def qkv(B: int, T: int, H: int, K: int, seed: int = 0) -> tuple[jax.Array, ...]:
  """Random queries, keys and values, B×T×H×K."""
  return tuple(jax.random.normal(jax.random.key(seed + i), (B, T, H, K)) for i in range(3))


def loss_and_grads(impl: str, q, k, v):
  """A weighted sum of the attention output and its gradients with respect to q, k and v."""
  w = jax.random.normal(jax.random.key(9), q.shape)
  f = lambda q, k, v: jnp.sum(w * attention.causal_attention(q, k, v, impl, HERE))
  return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(q, k, v)


@pytest.mark.parametrize(
  "B,T,H,K,block,heads_per_step",
  [
    (2, 130, 4, 16, 64, 2),  # three query blocks, the last one ragged
    (3, 96, 2, 8, 128, 4),  # one block; 4 pairs per step does not divide B·H = 6 (gcd: 2)
    (2, 130, 4, 16, None, None),  # blocked_plan's: 5 blocks of 32 rows, all 8 pairs in one step (no loop)
  ],
)
def test_blocked_attention_matches_the_reference_with_gradients(B, T, H, K, block, heads_per_step):
  q, k, v = qkv(B, T, H, K)
  blocked = functools.partial(attention.blocked_attention, block=block, heads_per_step=heads_per_step)
  np.testing.assert_allclose(
    jax.jit(blocked)(q, k, v), attention.causal_attention(q, k, v, "xla", HERE), atol=2e-6, rtol=1e-5
  )
  w = jax.random.normal(jax.random.key(9), q.shape)
  got = jax.jit(jax.grad(lambda *a: jnp.sum(w * blocked(*a)), argnums=(0, 1, 2)))(q, k, v)
  want = loss_and_grads("xla", q, k, v)[1]
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("pairs,T", [(16, 128), (64, 256), (64, 512), (6, 2048), (1, 8192)])
def test_blocked_plan_takes_the_most_pairs_whose_scores_fit(pairs, T):
  block, n = attention.blocked_plan(pairs, T)
  assert block >= 32 and -(-T // block) <= attention.MAX_BLOCKS
  fits = lambda m: pairs % m == 0 and 4 * m * block * T <= attention.SCORES_BYTES
  assert pairs % n == 0 and (fits(n) or n == 1)
  assert not any(fits(m) for m in range(n + 1, pairs + 1))


def test_blocked_attention_is_causal_and_matches_a_direct_softmax():
  """Position t's output is softmax(q_t·k_s/√K) over s ≤ t applied to v, computed here row by row in numpy."""
  q, k, v = (np.asarray(x, np.float64) for x in qkv(1, 40, 2, 4))
  out = np.asarray(attention.blocked_attention(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)), block=16))
  for t in (0, 15, 16, 39):
    for h in range(2):
      logits = k[0, : t + 1, h] @ q[0, t, h] / 2.0
      p = np.exp(logits - logits.max())
      np.testing.assert_allclose(out[0, t, h], (p / p.sum()) @ v[0, : t + 1, h], atol=1e-5)
  changed = np.array(v)
  changed[0, 30:] += 100.0  # the future cannot leak into earlier positions
  out2 = np.asarray(attention.blocked_attention(*(jnp.asarray(x, jnp.float32) for x in (q, k, changed)), block=16))
  np.testing.assert_array_equal(out2[0, :30], out[0, :30])


def test_splash_kernel_in_interpret_mode_matches_the_reference_with_gradients():
  """The Pallas TPU kernel, run by the Pallas interpreter on this CPU."""
  q, k, v = qkv(1, 256, 2, 16)
  with pytest.warns(UserWarning, match="interpret mode"):
    (value, got) = loss_and_grads("splash", q, k, v)
  want_value, want = loss_and_grads("xla", q, k, v)
  np.testing.assert_allclose(value, want_value, rtol=1e-5)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, atol=2e-5, rtol=1e-4)


def test_splash_falls_back_to_xla_for_lengths_it_cannot_tile():
  q, k, v = qkv(2, 40, 2, 8)
  np.testing.assert_array_equal(
    attention.causal_attention(q, k, v, "splash", HERE), attention.causal_attention(q, k, v, "xla", HERE)
  )


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU")
def test_cudnn_attention_matches_the_reference_in_bf16():
  q, k, v = (x.astype(jnp.bfloat16) for x in qkv(2, 256, 4, 64))
  got = attention.causal_attention(q, k, v, "cudnn", HERE).astype(jnp.float32)
  want = attention.causal_attention(*(x.astype(jnp.float32) for x in (q, k, v)), "xla", HERE)
  np.testing.assert_allclose(got, want, atol=3e-2)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the message given off GPU")
def test_cudnn_off_gpu_is_named():
  with pytest.raises(ValueError, match="attention_impl='cudnn' needs an NVIDIA GPU"):
    attention.causal_attention(*qkv(1, 8, 2, 4), "cudnn", HERE)


@pytest.mark.parametrize(
  "backend,dtype,T,want",
  [
    ("cpu", jnp.float32, 512, "blocked"),
    ("cpu", jnp.float32, 100, "blocked"),
    ("gpu", jnp.bfloat16, 512, "cudnn"),
    ("gpu", jnp.float32, 512, "xla"),
    ("tpu", jnp.bfloat16, 512, "splash"),
    ("tpu", jnp.bfloat16, 100, "xla"),
  ],
)
def test_auto_picks_the_backend_s_kernel(backend, dtype, T, want):
  assert attention.resolve("auto", dtype, T, backend) == want
  assert attention.resolve("xla", dtype, T, backend) == "xla"


def test_an_unknown_implementation_names_the_field():
  with pytest.raises(ValueError, match=r"model.attention_impl='flash'.*choose one of"):
    ModelConfig(attention_impl="flash")
  assert ModelConfig(attention_impl=None).attention_impl == "auto"  # configs saved before the field had names


def tiny(family: str, **changes) -> tuple[ModelConfig, dict]:
  """A small tapered model with calibrated-looking weights."""
  cfg = ModelConfig(family=family, V=50, D=32, H=4, L=3, T=128, internal_norm="taper", final_norm="taper", **changes)
  variables = forms.perturbed(init(cfg, jax.random.key(0)), jax.random.key(1), (0.05, 0.5), 0.1)
  return cfg, variables


@pytest.mark.parametrize(
  "family,impl",
  [
    ("llama", "blocked"),
    pytest.param("gpt2", "blocked", marks=pytest.mark.slow),
    pytest.param("llama", "splash", marks=pytest.mark.slow),
  ],
)
def test_model_logits_and_gradients_agree_across_implementations(family, impl):
  cfg, variables = tiny(family)
  tokens_BxT = jax.random.randint(jax.random.key(2), (2, 128), 0, cfg.V)

  def loss(params, impl):
    logits_BxTxV = Transformer(cfg.replace(attention_impl=impl)).apply({**variables, "params": params}, tokens_BxT, 0.3)
    return jnp.mean(jax.nn.logsumexp(logits_BxTxV, -1) - logits_BxTxV[..., 0])

  value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  want, want_grads = value_and_grad(variables["params"], "xla")
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "model.attention_impl='splash'")  # interpret mode on this CPU
    got, got_grads = value_and_grad(variables["params"], impl)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for g, r in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(g, r, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("impl,remat", [pytest.param("xla", False, marks=pytest.mark.slow), ("blocked", True)])
def test_prefill_of_ragged_prompts_matches_attention_over_the_cache(impl, remat):
  """A prefill attends within the prompt chunk through the selected implementation; the second path attends over
  the cache slots (what decode steps do). Right-padded prompts of different lengths."""
  cfg, variables = tiny("llama", attention_impl=impl, remat=remat)
  prompt_BxP = jax.random.randint(jax.random.key(3), (3, 70), 0, cfg.V)
  lengths_B = jnp.array([70, 41, 1], jnp.int32)
  cache = decode.init_cache(cfg, 3, 80)
  logits_BxV, filled = jax.jit(decode.prefill, static_argnums=1)(variables, cfg, prompt_BxP, lengths_B, cache)
  model = Transformer(cfg)
  h_BxPxD, over_cache = jax.jit(functools.partial(model.apply, method=Transformer.decode))(
    variables, prompt_BxP, cache, jnp.zeros(3, jnp.int32), 0.0
  )
  h_Bx1xD = jnp.take_along_axis(h_BxPxD, (lengths_B - 1)[:, None, None], axis=1)
  np.testing.assert_allclose(
    logits_BxV, model.apply(variables, h_Bx1xD, 0.0, method=Transformer.logits)[:, 0], atol=1e-5
  )
  for got, want in zip(jax.tree.leaves(filled), jax.tree.leaves(over_cache)):
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("family,remat", [("llama", False), ("gpt2", False), ("llama", True)])
def test_last_token_forward_equals_the_full_forward(family, remat):
  """Only the last position's queries, MLP and head run in the last block; the logits are those of a full pass."""
  cfg, variables = tiny(family, remat=remat)
  tokens_BxT = jax.random.randint(jax.random.key(4), (3, 57), 0, cfg.V)
  full_BxTxV = jax.jit(Transformer(cfg).apply)(variables, tokens_BxT, 0.0)
  np.testing.assert_allclose(forms.last_token_logits(cfg)(variables, tokens_BxT), full_BxTxV[:, -1], atol=2e-6)
  every_position = forms.last_token_logits(cfg, every_position=True)(variables, tokens_BxT)
  np.testing.assert_allclose(every_position, full_BxTxV[:, -1], atol=2e-6)
