"""Device mesh and logical-axis rules: parallelism is a config change (`mesh.data`, `mesh.fsdp`).

Parameters (and the optimiser state beside them) are split along `embed` over `fsdp`, so each device holds
1/fsdp of them and gathers one layer's weights where they are used; activations keep their batch split over
every mesh axis (`constrain`, at the model's block boundaries), so each device computes its own rows. A mesh
over several TPU slices puts the `data` axis across slices (DCN) and `fsdp` within each slice (ICI).
"""

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp")
BATCH_AXES = MESH_AXES  # the batch is split over every device
# Logical parameter axis → mesh axis: parameters are fully sharded along `embed` over `fsdp`.
RULES = (
  ("batch", BATCH_AXES),
  ("embed", "fsdp"),
  ("vocab", None),
  ("mlp", None),
  ("heads", None),
  ("kv", None),
  ("norm", None),
)
# Logical activation axis → mesh axis: only the batch is split (the features stay whole on each device).
ACTIVATION_RULES = (
  ("activation_batch", BATCH_AXES),
  ("activation_length", None),
  ("activation_embed", None),
  ("activation_vocab", None),
)
HIDDEN_AXES = ("activation_batch", "activation_length", "activation_embed")  # B×T×D
LOGITS_AXES = ("activation_batch", "activation_length", "activation_vocab")  # B×T×V
PLATFORMS = ("cpu", "gpu", "tpu")
_PLATFORM_NAMES = {"cuda": "gpu", "rocm": "gpu"}  # jax's device platforms → the project's names


def platform_of(devices: Mesh | Sequence[Any] | np.ndarray | None) -> str:
  """`cpu`, `gpu` or `tpu`: the platform of `devices` (a mesh, or an array or sequence of devices; None: jax's
  default devices). Every device-dependent choice follows this, never the host's backend."""
  if devices is None:
    devices = jax.devices()
  elif isinstance(devices, Mesh):
    devices = devices.devices
  platform = np.asarray(devices, dtype=object).flat[0].platform
  return _PLATFORM_NAMES.get(platform, platform)


def batch_devices(mesh: Mesh) -> int:
  """How many ways the batch is split: the product of the batch axes' sizes."""
  return int(np.prod([mesh.shape[axis] for axis in BATCH_AXES]))


def constrain(x: jax.Array, axes: tuple[str | None, ...], mesh: Mesh | None) -> jax.Array:
  """`x` with its sharding fixed to the logical activation `axes` on `mesh` (ACTIVATION_RULES); unchanged without a
  mesh, or where the batch does not divide over the batch axes (a single decode row), which XLA then replicates."""
  if mesh is None or mesh.size == 1 or x.shape[0] % batch_devices(mesh):
    return x
  spec = nn.logical_to_mesh_axes(axes, ACTIVATION_RULES)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def per_device(fn: Callable[..., jax.Array], mesh: Mesh | None) -> Callable[..., jax.Array]:
  """`fn` of B×… arrays, run by each device of `mesh` on its own rows (shard_map over the batch axes): the way a
  custom call that XLA cannot split (a Pallas/Mosaic kernel, a CPU FFI kernel) keeps the batch split. Rows that do
  not divide over the batch axes (a single decode row) go whole to every device; without a mesh, `fn` itself."""
  if mesh is None or mesh.size == 1:
    return fn

  @functools.wraps(fn)
  def run(*xs: jax.Array) -> jax.Array:
    spec = P(BATCH_AXES) if xs[0].shape[0] % batch_devices(mesh) == 0 else P()
    return jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(*xs)

  return run


def make_mesh(data: int = -1, fsdp: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
  """A (data, fsdp) mesh over `devices` (default: all); `data=-1` takes what `fsdp` leaves.

  TPU devices are laid out along the chips' physical links (`mesh_utils.create_device_mesh`); devices of several
  slices put `data` across the slices and `fsdp` within each (`create_hybrid_device_mesh`); others (CPU, GPU) in
  the order given.
  """
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  if fsdp < 1 or n % fsdp:
    raise ValueError(f"mesh.fsdp={fsdp} must be a positive divisor of the device count ({n})")
  if data == -1:
    data = n // fsdp
  if data < 1 or data * fsdp != n:
    raise ValueError(f"mesh.data={data} × mesh.fsdp={fsdp} must equal the device count ({n}); use mesh.data=-1")
  slices = len({getattr(d, "slice_index", 0) or 0 for d in devices})
  if slices > 1:
    if data % slices:
      raise ValueError(
        f"mesh.data={data}: the {n} devices span {slices} slices, and the data axis is the one that "
        f"crosses them (fsdp's gathers stay within a slice); make mesh.data a multiple of {slices} "
        f"(mesh.fsdp at most {n // slices})"
      )
    grid = mesh_utils.create_hybrid_device_mesh(
      (data // slices, fsdp), (slices, 1), devices, allow_split_physical_axes=True
    )
  elif platform_of(devices) == "tpu":
    grid = mesh_utils.create_device_mesh((data, fsdp), devices, allow_split_physical_axes=True)
  else:
    grid = np.asarray(devices).reshape(data, fsdp)
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 2)


def distributed_options(mesh_cfg: ml_collections.ConfigDict) -> dict[str, Any] | None:
  """`jax.distributed.initialize`'s arguments from `mesh.*` (None: single process); unset fields are auto-detected."""
  address, count, index = (
    mesh_cfg.get("coordinator_address", ""),
    mesh_cfg.get("num_processes", -1),
    mesh_cfg.get("process_id", -1),
  )
  given = [
    f"mesh.{name}={value!r}"
    for name, value, unset in (
      ("coordinator_address", address, ""),
      ("num_processes", count, -1),
      ("process_id", index, -1),
    )
    if value != unset
  ]
  if not mesh_cfg.distributed:
    if given:
      raise ValueError(
        f"{', '.join(given)} without mesh.distributed=True: set it to start a multi-process run, or "
        "leave those fields unset"
      )
    return None
  if count != -1 and count < 1:
    raise ValueError(f"mesh.num_processes={count!r}: must be >= 1, or -1 to auto-detect")
  if index != -1 and not (index >= 0 and (count == -1 or index < count)):
    allowed = "must be >= 0" if count == -1 else f"must lie in [0, mesh.num_processes={count})"
    raise ValueError(f"mesh.process_id={index!r}: {allowed}, or -1 to auto-detect")
  if address and not re.fullmatch(r"\S+:\d+", address):
    raise ValueError(
      f"mesh.coordinator_address={address!r}: give HOST:PORT of process 0 (e.g. 10.0.0.2:1234), or "
      "leave it empty to auto-detect"
    )
  return {
    "coordinator_address": address or None,
    "num_processes": None if count == -1 else count,
    "process_id": None if index == -1 else index,
  }


def shardings(variables: Any, mesh: Mesh) -> Any:
  """NamedShardings for a (boxed or abstract) variable tree; unannotated leaves are replicated."""
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(variables), mesh, RULES)


def stacked_shardings(variables: Any, mesh: Mesh) -> Any:
  """NamedShardings for L copies of a (boxed or abstract) variable tree stacked on a leading layer axis: that axis
  whole, every other as `shardings` places it, so each layer's slice is laid out as the layer itself is."""
  return jax.tree.map(behind_layer_axis, shardings(variables, mesh))


def behind_layer_axis(placement: NamedSharding) -> NamedSharding:
  """`placement` of one layer's array, for L of them stacked on a leading, unsharded layer axis."""
  return NamedSharding(placement.mesh, P(None, *placement.spec))


def within_layer(placement: NamedSharding) -> NamedSharding:
  """`placement` of L arrays stacked on a leading layer axis, for one layer's: the inverse of `behind_layer_axis`."""
  return NamedSharding(placement.mesh, P(*placement.spec[1:]))


def shard(variables: Any, mesh: Mesh) -> Any:
  """Unboxes `variables` and places every leaf with its mesh sharding."""
  return jax.device_put(nn.unbox(variables), shardings(variables, mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a B×… batch: rows split over every device."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  """Full replication (scalars, step counters)."""
  return NamedSharding(mesh, P())
