"""The products as 2-D matrix products with a written-out backward (`cpu_kernels/projection.py`): every product of
the model, forward and gradients, against the model's own einsum; specs that are no matrix product; and the choice
`for_training` makes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tapernorm_jax import cpu_kernels
from tapernorm_jax.cpu_kernels.projection import matrix_form, matrix_product
from tapernorm_jax.model import ModelConfig, Transformer, init
from tapernorm_jax.model.gates import Gates
from tapernorm_jax.model.seams import einsum


@pytest.mark.parametrize(
  "family,tie,value_gates",
  [("llama", True, False), ("llama", False, False), ("gpt2", True, False), ("gpt2", True, True)],
)
def test_gradients_of_every_product_equal_the_model_einsums(family, tie, value_gates):
  cfg = ModelConfig(
    family=family, V=50, D=32, H=4, L=2, T=16, tie_embeddings=tie, internal_norm="taper", final_norm="taper"
  )
  variables = init(cfg, jax.random.key(0))
  tokens_BxT = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.V)
  w_BxTxV = jax.random.normal(jax.random.key(2), (2, 16, cfg.V))
  # one gate per norm, then one per block for the value path: queries and keys, and values, from two projections
  values = jnp.linspace(0.2, 0.8, 3 * cfg.L + 1)
  gate = (
    Gates(
      attn=values[: cfg.L], mlp=values[cfg.L : 2 * cfg.L], final=values[2 * cfg.L], attn_value=values[2 * cfg.L + 1 :]
    )
    if value_gates
    else jnp.float32(0.5)
  )

  def loss_and_grads(projection):
    loss = lambda params: jnp.sum(
      w_BxTxV * Transformer(cfg, projection=projection).apply({**variables, "params": params}, tokens_BxT, gate)
    )
    return jax.jit(jax.value_and_grad(loss))(variables["params"])

  (loss, grads), (expected_loss, expected_grads) = loss_and_grads(matrix_product), loss_and_grads(einsum)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
  scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(expected_grads))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5 * scale, rtol=0), grads, expected_grads)


def test_training_on_cpu_is_offered_the_written_out_backward():
  paths = cpu_kernels.training_paths(ModelConfig(V=16, D=16, H=2, L=1, T=8, attention_impl="xla"))
  assert jax.default_backend() == "cpu" and paths == {"xla": (einsum, None), "kernels": (matrix_product, None)}


@pytest.mark.parametrize(
  "spec,form",
  [
    ("bld,dthk->blthk", (6, 4, 36, True, (2, 3, 3, 3, 4))),
    ("bthk,hkd->btd", (6, 12, 5, True, (2, 3, 5))),
    ("bld,vd->blv", (6, 4, 7, False, (2, 3, 7))),
  ],
)
def test_matrix_form_of_the_models_specs(spec, form):
  shapes = {"b": 2, "l": 3, "t": 3, "d": 4, "h": 3, "k": 4, "v": 7}
  shapes = {**shapes, "d": 5} if spec.startswith("bthk") else shapes
  x_shape, w_shape = (tuple(shapes[a] for a in axes) for axes in spec.split("->")[0].split(","))
  assert tuple(matrix_form(spec, x_shape, w_shape)) == form


@pytest.mark.parametrize("spec", ["bld,dlv->bv", "bdl,dv->blv", "bld,dv->bvl", "bhd,dh->bh"])
def test_a_spec_that_is_no_matrix_product_is_named(spec):
  with pytest.raises(ValueError, match=f"{spec!r} is not a matrix product"):
    matrix_form(spec, (2, 3, 4), (4, 3, 5) if spec.startswith("bld,dlv") else (4, 5))


def test_operands_of_two_dtypes_are_promoted_as_einsum_promotes():
  x_BxTxD = jax.random.normal(jax.random.key(0), (2, 3, 4))
  w_DxF = jax.random.normal(jax.random.key(1), (4, 5)).astype(jnp.bfloat16)
  got, expected = (f(None, "w", "btd,df->btf", x_BxTxD, w_DxF) for f in (matrix_product, einsum))
  assert got.dtype == expected.dtype == jnp.float32
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  dw = jax.grad(lambda w: jnp.sum(matrix_product(None, "w", "btd,df->btf", x_BxTxD, w)))(w_DxF)
  assert dw.dtype == jnp.bfloat16
