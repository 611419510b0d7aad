"""Mesh construction and logical-axis sharding on 8 fake CPU devices."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tapernorm_jax import sharding
from tapernorm_jax.model import ModelConfig, Transformer, init

CFG = ModelConfig(V=64, D=32, H=4, L=2, T=16, internal_norm="taper", final_norm="taper")


def test_fsdp_shards_embed_axis_and_matches_single_device_forward():
  assert jax.device_count() == 8
  mesh = sharding.make_mesh(data=2, fsdp=4)
  variables = init(CFG, jax.random.key(0))
  sharded = sharding.shard(variables, mesh)
  qkv = sharded["params"]["block_0"]["attn"]["qkv"]
  assert qkv.sharding.spec[0] == "fsdp" and len(qkv.addressable_shards) == 8
  assert qkv.addressable_shards[0].data.shape[0] == CFG.D // 4
  tokens = jax.device_put(jax.random.randint(jax.random.key(1), (8, 12), 0, CFG.V), sharding.batch_sharding(mesh))
  out = jax.jit(lambda v, t: Transformer(CFG).apply(v, t, gate=jnp.float32(0.5)))(sharded, tokens)
  ref = Transformer(CFG).apply(nn.unbox(variables), np.asarray(tokens), gate=0.5)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("data,fsdp,field", [(3, 1, "mesh.data"), (1, 3, "mesh.fsdp"), (-1, 0, "mesh.fsdp")])
def test_bad_mesh_shapes_are_named(data, fsdp, field):
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    sharding.make_mesh(data, fsdp)
