"""Scale anchoring (docs/method.md §5): radial gradients with and without a final norm, and the aux-loss gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tapernorm_jax.model import ModelConfig, Transformer, init
from tapernorm_jax.taper import losses

CFG = ModelConfig(V=50, D=32, H=4, L=1, T=16)


def _head_and_state(final_norm: str, eps: float = 1e-5, seed: int = 0):
  """The model's output head as a function of h, and a batch of pre-logit states and targets."""
  cfg = CFG.replace(final_norm=final_norm, eps=eps)
  variables = init(cfg, jax.random.key(seed))
  k1, k2, k3 = jax.random.split(jax.random.key(seed + 1), 3)
  h_BxTxD = jax.random.normal(k1, (2, 8, cfg.D)) * jnp.exp(jax.random.normal(k2, (2, 8, 1)))
  targets_BxT = jax.random.randint(k3, (2, 8), 0, cfg.V)
  head = lambda h: Transformer(cfg).apply(variables, h, 0.0, method=Transformer.logits)
  return head, h_BxTxD, targets_BxT


def _token_losses(head, h, y):
  """Sum of per-token cross-entropies: its gradient at each token is that token's ∇_h ℓ."""
  return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(head(h), y))


def test_final_rmsnorm_kills_the_radial_gradient():
  head, h, y = _head_and_state("plain", eps=1e-12)
  grad = jax.grad(_token_losses, argnums=1)(head, h, y)
  inner = jnp.sum(grad * h, -1)
  assert float(jnp.max(jnp.abs(inner) / (jnp.linalg.norm(grad, axis=-1) * jnp.linalg.norm(h, axis=-1)))) < 1e-5


def test_without_a_final_norm_the_radial_gradient_is_mean_logit_minus_target_logit():
  head, h, y = _head_and_state("identity")
  grad = jax.grad(_token_losses, argnums=1)(head, h, y)
  z = head(h)
  expected = jnp.sum(jax.nn.softmax(z) * z, -1) - jnp.take_along_axis(z, y[..., None], -1)[..., 0]
  np.testing.assert_allclose(jnp.sum(grad * h, -1), expected, rtol=1e-4, atol=1e-5)


def test_margin_bound_when_the_target_wins():
  head, h, _ = _head_and_state("identity", seed=3)
  h = 20 * h  # large logits, so margins are clearly positive
  z = head(h)
  y = jnp.argmax(z, -1)
  grad = jax.grad(_token_losses, argnums=1)(head, h, y)
  p_y = jnp.take_along_axis(jax.nn.softmax(z), y[..., None], -1)[..., 0]
  margin = jnp.sort(z, -1)[..., -1] - jnp.sort(z, -1)[..., -2]
  assert bool(jnp.all(margin > 0))
  inner = jnp.sum(grad * h, -1)
  assert bool(jnp.all(inner <= -(1 - p_y) * margin + 1e-5))
  assert bool(jnp.all(inner < 0))  # cross-entropy rewards growing ‖h‖: logit chasing


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_aux_gradient_is_the_radial_restoring_force(kind):
  lam, s_tgt, eps = 0.1, 0.7, 1e-5
  h = jax.random.normal(jax.random.key(0), (3, 4, 16)) * 1.5 + (0.4 if kind == "ln" else 0.0)
  grad = jax.grad(lambda h: lam * losses.scale_loss(h, s_tgt, kind, eps))(h)
  hbar = h - h.mean(-1, keepdims=True) if kind == "ln" else h
  s = jnp.sqrt(jnp.mean(hbar**2, -1, keepdims=True) + eps)
  n_tokens, d = 12, 16
  expected = 2 * lam * (s - s_tgt) / (d * s) * hbar / n_tokens  # the mean over tokens adds 1/N
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-8)


def test_radial_gradient_diagnostic_and_logit_norm():
  g = jnp.array([[[3.0, 4.0], [0.0, 1.0]]])
  h = jnp.array([[[3.0, 4.0], [2.0, 0.0]]])
  np.testing.assert_allclose(losses.radial_gradient(g, h), (25 / 5 + 0) / 2)
  np.testing.assert_allclose(losses.logit_norm(h), (5 + 2) / 2)


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_the_token_form_is_the_mean_form_plus_the_tokens_variance_of_scale(kind):
  """mean((s − t)²) = (mean s − t)² + var(s): the method's form also pulls each token's scale to the batch's, the
  mean form (`taper.scale_loss_form=mean`) only the batch's mean; they agree when every token's scale is equal."""
  _, h_BxTxD, _ = _head_and_state("plain")
  s_BxT = losses.pre_logit_scale(h_BxTxD, kind, 1e-5)
  token, mean = losses.scale_loss(h_BxTxD, 0.7, kind, 1e-5), losses.mean_scale_loss(h_BxTxD, 0.7, kind, 1e-5)
  np.testing.assert_allclose(token - mean, np.var(np.asarray(s_BxT)), rtol=1e-5)
  equal_BxTxD = h_BxTxD / s_BxT[..., None]  # every token's scale 1
  np.testing.assert_allclose(
    losses.scale_loss(equal_BxTxD, 0.7, kind, 1e-5), losses.mean_scale_loss(equal_BxTxD, 0.7, kind, 1e-5), rtol=1e-4
  )
