"""Device mesh and logical-axis rules: parallelism is a config change (`mesh.data`, `mesh.fsdp`)."""

from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp")
# Logical parameter/activation axis → mesh axis. Parameters are fully sharded along `embed`
# over `fsdp`; the batch is split over every device.
RULES = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("vocab", None),
    ("mlp", None),
    ("heads", None),
    ("kv", None),
    ("norm", None),
)


def make_mesh(data: int = -1, fsdp: int = 1, devices: list | None = None) -> Mesh:
  """A (data, fsdp) mesh over `devices` (default: all); `data=-1` takes what `fsdp` leaves."""
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  if fsdp < 1 or n % fsdp:
    raise ValueError(f"mesh.fsdp={fsdp} must be a positive divisor of the device count ({n})")
  if data == -1:
    data = n // fsdp
  if data < 1 or data * fsdp != n:
    raise ValueError(f"mesh.data={data} × mesh.fsdp={fsdp} must equal the device count ({n}); use mesh.data=-1")
  return Mesh(np.asarray(devices).reshape(data, fsdp), MESH_AXES, axis_types=(AxisType.Auto,) * 2)


def shardings(variables: Any, mesh: Mesh) -> Any:
  """NamedShardings for a (boxed or abstract) variable tree; unannotated leaves are replicated."""
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(variables), mesh, RULES)


def shard(variables: Any, mesh: Mesh) -> Any:
  """Unboxes `variables` and places every leaf with its mesh sharding."""
  return jax.device_put(nn.unbox(variables), shardings(variables, mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a B×… batch: rows split over every device."""
  return NamedSharding(mesh, P(MESH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  """Full replication (scalars, step counters)."""
  return NamedSharding(mesh, P())
