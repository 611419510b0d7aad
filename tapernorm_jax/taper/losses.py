"""Cross-entropy, the fixed-target scale loss, and the scale-anchoring diagnostics (docs/method.md §5)."""

import jax
import jax.numpy as jnp
import optax

from tapernorm_jax.model.norms import pre_logit_scale

Array = jax.Array


def cross_entropy(logits_BxTxV: Array, targets_BxT: Array) -> Array:
  """Mean token cross-entropy in nats, computed in fp32."""
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV.astype(jnp.float32), targets_BxT))


def scale_loss(h_BxTxD: Array, s_tgt: Array, kind: str, eps: float) -> Array:
  """The fixed-target scale loss without λ: mean over tokens of (s(h) − s_tgt)²."""
  return jnp.mean(jnp.square(pre_logit_scale(h_BxTxD, kind, eps) - s_tgt))


def mean_scale_loss(h_BxTxD: Array, s_tgt: Array, kind: str, eps: float) -> Array:
  """The batch-mean form without λ: (mean over tokens of s(h) − s_tgt)², which holds the scale and leaves each
  token's free about it (an intervention on the scale loss, `taper.scale_loss_form=mean`)."""
  return jnp.square(jnp.mean(pre_logit_scale(h_BxTxD, kind, eps)) - s_tgt)


def ordinary_tokens(tokens_BxT: Array, eot_id: int = -1) -> Array:
  """Marks the tokens neither at position 0 (an attention sink) nor end-of-text (`eot_id`; -1: none), B×T."""
  return (jnp.arange(tokens_BxT.shape[1]) > 0)[None, :] & (tokens_BxT != eot_id)


def batch_scale_loss(h_BxTxD: Array, kind: str, eps: float, counted_BxT: Array | None = None) -> Array:
  """FakeLN's aux loss without λ: mean over every token of (s(h) − s̄)², s̄ the batch mean of s(h) over the tokens
  `counted_BxT` marks (all when None), held constant."""
  s_BxT = pre_logit_scale(h_BxTxD, kind, eps)
  target = (
    jnp.mean(s_BxT)
    if counted_BxT is None
    else (jnp.sum(jnp.where(counted_BxT, s_BxT, 0.0)) / jnp.maximum(jnp.sum(counted_BxT), 1))
  )
  return jnp.mean(jnp.square(s_BxT - jax.lax.stop_gradient(target)))


def radial_gradient(grad_BxTxD: Array, h_BxTxD: Array) -> Array:
  """Mean over tokens of ⟨∇_h ℓ, h⟩ / ‖h‖: the loss gradient's component along the pre-logit state."""
  grad, h = grad_BxTxD.astype(jnp.float32), h_BxTxD.astype(jnp.float32)
  return jnp.mean(jnp.sum(grad * h, axis=-1) / jnp.maximum(jnp.linalg.norm(h, axis=-1), 1e-12))


def logit_norm(logits_BxTxV: Array) -> Array:
  """Mean L2 norm of the logit vectors."""
  return jnp.mean(jnp.linalg.norm(logits_BxTxV.astype(jnp.float32), axis=-1))
