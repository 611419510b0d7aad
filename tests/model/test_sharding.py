"""Mesh construction and logical-axis sharding on every device (8 fake CPU devices by default); the multi-host
start's config fields."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import base
from tapernorm_jax.model import ModelConfig, Transformer, init, sharding

CFG = ModelConfig(V=64, D=32, H=4, L=2, T=16, internal_norm="taper", final_norm="taper")


def test_fsdp_shards_embed_axis_and_matches_single_device_forward():
  n = jax.device_count()  # 8 on the fake CPU devices (conftest.py); an accelerator host's own count otherwise
  data = 2 if n % 2 == 0 else 1
  fsdp = n // data
  if CFG.D % fsdp:
    pytest.skip(f"{n} devices: D={CFG.D} does not split over fsdp={fsdp}")
  mesh = sharding.make_mesh(data=data, fsdp=fsdp)
  variables = init(CFG, jax.random.key(0))
  sharded = sharding.shard(variables, mesh)
  qkv = sharded["params"]["block_0"]["attn"]["qkv"]
  assert qkv.sharding.spec[0] == "fsdp" and len(qkv.addressable_shards) == n
  assert qkv.addressable_shards[0].data.shape[0] == CFG.D // fsdp
  tokens = jax.device_put(
    jax.random.randint(jax.random.key(1), (n * max(1, 8 // n), 12), 0, CFG.V), sharding.batch_sharding(mesh)
  )
  out = jax.jit(lambda v, t: Transformer(CFG).apply(v, t, gate=jnp.float32(0.5)))(sharded, tokens)
  ref = Transformer(CFG).apply(nn.unbox(variables), np.asarray(tokens), gate=0.5)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_the_target_platform_decides_what_auto_stands_for_and_is_never_saved():
  cfg = CFG.replace(dtype="auto")
  assert [cfg.for_platform(p).compute_dtype for p in ("cpu", "gpu", "tpu")] == [jnp.float32, jnp.bfloat16, jnp.bfloat16]
  assert cfg.platform == "" and cfg.target_platform == sharding.platform_of(jax.devices())  # an eager apply's devices
  assert cfg.for_devices(sharding.make_mesh()).platform == cfg.target_platform
  assert "platform" not in cfg.for_platform("tpu").to_dict() and ModelConfig(**cfg.to_dict()) == cfg
  with pytest.raises(ValueError, match=r"model\.platform='TPU': choose one of \('cpu', 'gpu', 'tpu'\)"):
    cfg.for_platform("TPU")


@pytest.mark.parametrize("data,fsdp,field", [(3, 1, "mesh.data"), (1, 3, "mesh.fsdp"), (-1, 0, "mesh.fsdp")])
def test_bad_mesh_shapes_are_named(data, fsdp, field):
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    sharding.make_mesh(data, fsdp)


def mesh_config(**fields) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({**base.get_config().mesh.to_dict(), **fields})


def test_distributed_options_default_to_auto_detection_and_pass_explicit_values():
  assert sharding.distributed_options(mesh_config()) is None  # one process: no jax.distributed.initialize
  assert sharding.distributed_options(mesh_config(distributed=True)) == {
    "coordinator_address": None,
    "num_processes": None,
    "process_id": None,
  }
  assert sharding.distributed_options(
    mesh_config(distributed=True, coordinator_address="10.0.0.2:1234", num_processes=4, process_id=3)
  ) == {"coordinator_address": "10.0.0.2:1234", "num_processes": 4, "process_id": 3}


@pytest.mark.parametrize(
  "fields,problem",
  [
    ({"process_id": 1}, r"mesh\.process_id=1 without mesh\.distributed=True"),
    ({"distributed": True, "num_processes": 0}, r"mesh\.num_processes=0: must be >= 1"),
    ({"distributed": True, "num_processes": 2, "process_id": 2}, r"mesh\.process_id=2: must lie in \[0, .*=2\)"),
    ({"distributed": True, "process_id": -2}, r"mesh\.process_id=-2: must be >= 0, or -1"),
    (
      {"distributed": True, "coordinator_address": "localhost"},
      r"mesh\.coordinator_address='localhost': give HOST:PORT",
    ),
  ],
)
def test_bad_distributed_fields_are_named(fields, problem):
  with pytest.raises(ValueError, match=problem):
    sharding.distributed_options(mesh_config(**fields))
