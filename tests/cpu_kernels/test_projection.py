"""The einsum with a written-out backward (`cpu_kernels/projection.py`): every product of the model, forward and
gradients, against the model's own einsum; and the choice `for_training` makes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tapernorm_jax import cpu_kernels
from tapernorm_jax.cpu_kernels.projection import einsum_explicit_backward
from tapernorm_jax.model import ModelConfig, Transformer, init
from tapernorm_jax.model.transformer import einsum


@pytest.mark.parametrize("family,tie", [("llama", True), ("llama", False), ("gpt2", True)])
def test_gradients_of_every_product_equal_the_model_einsums(family, tie):
  cfg = ModelConfig(family=family, V=50, D=32, H=4, L=2, T=16, tie_embeddings=tie, internal_norm="taper",
                    final_norm="taper")
  variables = init(cfg, jax.random.key(0))
  tokens_BxT = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.V)
  w_BxTxV = jax.random.normal(jax.random.key(2), (2, 16, cfg.V))

  def loss_and_grads(projection):
    loss = lambda params: jnp.sum(w_BxTxV * Transformer(cfg, projection=projection).apply(
        {**variables, "params": params}, tokens_BxT, jnp.float32(0.5)))
    return jax.jit(jax.value_and_grad(loss))(variables["params"])

  (loss, grads), (expected_loss, expected_grads) = loss_and_grads(einsum_explicit_backward), loss_and_grads(einsum)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
  scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(expected_grads))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5 * scale, rtol=0), grads, expected_grads)


def test_training_on_cpu_takes_the_written_out_backward():
  projection, attend = cpu_kernels.for_training(ModelConfig(V=16, D=16, H=2, L=1, T=8, attention_impl="xla"))
  assert jax.default_backend() == "cpu" and projection is einsum_explicit_backward and attend is None
