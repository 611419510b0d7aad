"""Device mesh and logical-axis rules: parallelism is a config change (`mesh.data`, `mesh.fsdp`)."""

import re
from typing import Any

import flax.linen as nn
import jax
import ml_collections
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


def distributed_options(mesh_cfg: ml_collections.ConfigDict) -> dict[str, Any] | None:
  """`jax.distributed.initialize`'s arguments from `mesh.*` (None: single process); unset fields are auto-detected."""
  address, count, index = (mesh_cfg.get("coordinator_address", ""), mesh_cfg.get("num_processes", -1),
                           mesh_cfg.get("process_id", -1))
  given = [f"mesh.{name}={value!r}" for name, value, unset in (("coordinator_address", address, ""),
                                                               ("num_processes", count, -1),
                                                               ("process_id", index, -1)) if value != unset]
  if not mesh_cfg.distributed:
    if given:
      raise ValueError(f"{', '.join(given)} without mesh.distributed=True: set it to start a multi-process run, or "
                       "leave those fields unset")
    return None
  if count != -1 and count < 1:
    raise ValueError(f"mesh.num_processes={count!r}: must be >= 1, or -1 to auto-detect")
  if index != -1 and not (index >= 0 and (count == -1 or index < count)):
    allowed = "must be >= 0" if count == -1 else f"must lie in [0, mesh.num_processes={count})"
    raise ValueError(f"mesh.process_id={index!r}: {allowed}, or -1 to auto-detect")
  if address and not re.fullmatch(r"\S+:\d+", address):
    raise ValueError(f"mesh.coordinator_address={address!r}: give HOST:PORT of process 0 (e.g. 10.0.0.2:1234), or "
                     "leave it empty to auto-detect")
  return {"coordinator_address": address or None, "num_processes": None if count == -1 else count,
          "process_id": None if index == -1 else index}


def initialize_distributed(mesh_cfg: ml_collections.ConfigDict) -> None:
  """`jax.distributed.initialize` with `distributed_options(mesh_cfg)` when `mesh.distributed` is set."""
  options = distributed_options(mesh_cfg)
  if options is not None:
    jax.distributed.initialize(**options)


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
