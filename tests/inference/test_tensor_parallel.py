"""The tensor-split serving programs against the one-device model, and what they move between devices."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tapernorm_jax.inference import decode, tensor_parallel
from tapernorm_jax.model import ModelConfig, init

FAMILIES = {
  "llama": ModelConfig(family="llama", V=97, D=64, H=8, L=2, T=32),  # F = 171: padded to split
  "gpt2": ModelConfig(family="gpt2", V=97, D=64, H=8, L=2, T=32, internal_norm="plain", final_norm="plain"),
}


def perturbed(variables, seed: int = 1):
  """`variables`, unboxed, with every float leaf moved off its initial value, so biases and gains are not 0 and 1."""
  leaves, tree = jax.tree.flatten(nn.unbox(variables))
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  move = lambda x, k: x + 0.05 * jax.random.normal(k, x.shape, x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
  return jax.tree.unflatten(tree, [move(x, k) for x, k in zip(leaves, keys)])


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("rows, tensor", [(1, 8), (2, 4)])
def test_split_prefill_and_decode_give_the_one_device_logits(family, rows, tensor):
  """Prefill and three decode steps split over `tensor` devices (the MLP padded where its width does not divide)
  give the one-device model's logits."""
  cfg = FAMILIES[family]
  variables = perturbed(init(cfg, jax.random.key(0)))
  mesh = tensor_parallel.make_mesh(jax.devices()[:8], tensor)
  B, S = 2 * rows, 16
  prompt_BxP = jax.random.randint(jax.random.key(2), (B, 5), 0, cfg.V)
  lengths_B = jnp.asarray([5, 3] * rows)
  wide_variables, wide = tensor_parallel.pad(variables, cfg, tensor)
  assert wide.mlp_dim % tensor == 0 and wide.mlp_dim - cfg.mlp_dim < tensor
  placed = jax.device_put(wide_variables, tensor_parallel.variable_shardings(wide, mesh))
  split_prefill = jax.jit(lambda v, p, n, c: tensor_parallel.prefill(v, wide, p, n, c, mesh))
  split_step = jax.jit(lambda v, t, i, c: tensor_parallel.decode_step(v, wide, t, i, c, mesh))
  logits_split, cache_split = split_prefill(placed, prompt_BxP, lengths_B, tensor_parallel.init_cache(wide, B, S, mesh))
  logits_one, cache_one = decode.prefill(variables, cfg, prompt_BxP, lengths_B, decode.init_cache(cfg, B, S))
  np.testing.assert_allclose(logits_split, logits_one, rtol=1e-4, atol=1e-5)
  index_B = lengths_B
  for step in range(3):  # each step reads what the earlier ones wrote into the split cache
    tokens_B = jnp.argmax(logits_one, axis=-1).astype(jnp.int32)
    logits_split, cache_split = split_step(placed, tokens_B, index_B, cache_split)
    logits_one, cache_one = decode.decode_step(variables, cfg, tokens_B, index_B, cache_one)
    np.testing.assert_allclose(logits_split, logits_one, rtol=1e-4, atol=1e-5, err_msg=f"decode step {step}")
    index_B = index_B + 1


def test_a_split_decode_step_moves_activations_not_weights():
  """The compiled step's collectives are the 2·L all-reduces of the B×1×D activation after the row-split
  projections: no weight is gathered."""
  cfg = FAMILIES["gpt2"]
  mesh = tensor_parallel.make_mesh(jax.devices()[:8], 4)
  B, S = 2, 16
  variables = jax.eval_shape(lambda: nn.unbox(init(cfg, jax.random.key(0))))
  placed = jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
    variables,
    tensor_parallel.variable_shardings(cfg, mesh),
  )
  cache = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=tensor_parallel.cache_sharding(mesh)),
    jax.eval_shape(lambda: decode.init_cache(cfg, B, S)),
  )
  rows = jax.ShapeDtypeStruct((B,), jnp.int32, sharding=jax.sharding.NamedSharding(mesh, jax.P(tensor_parallel.ROWS)))
  step = jax.jit(lambda v, t, i, c: tensor_parallel.decode_step(v, cfg, t, i, c, mesh))
  hlo = step.lower(placed, rows, rows, cache).compile().as_text()
  assert not re.search(r"all-gather|all-to-all|collective-permute", hlo)
  reduced = re.findall(r"= f32\[(\d+),1,(\d+)\]\{[^}]*\} all-reduce(?:-start)?\(", hlo)
  assert sorted(reduced) == [("1", str(cfg.D))] * (2 * cfg.L)  # one row per device group, D wide


@pytest.mark.parametrize(
  "field, cfg, tensor, message",
  [
    ("H", ModelConfig(V=97, D=64, H=2, L=1, T=32), 4, r"^model\.H=2 does not split over tensor=4 devices"),
    ("F", ModelConfig(V=97, D=64, H=8, L=1, T=32), 4, r"^model\.F=171 does not split over tensor=4 devices; pad it"),
  ],
)
def test_a_model_that_does_not_split_is_named(field, cfg, tensor, message):
  mesh = tensor_parallel.make_mesh(jax.devices()[:8], tensor)
  with pytest.raises(ValueError, match=message):
    tensor_parallel.init_cache(cfg, 2, 16, mesh)
  with pytest.raises(ValueError, match=message):
    tensor_parallel.variable_shardings(cfg, mesh)


def test_rows_that_do_not_split_and_a_bad_tensor_count_are_named():
  cfg = FAMILIES["gpt2"]
  with pytest.raises(ValueError, match=r"^batch=3 rows do not split over the mesh's 2 row groups"):
    tensor_parallel.init_cache(cfg, 3, 16, tensor_parallel.make_mesh(jax.devices()[:8], 4))
  with pytest.raises(ValueError, match=r"^tensor=3 must be a positive divisor of the device count \(8\)"):
    tensor_parallel.make_mesh(jax.devices()[:8], 3)
