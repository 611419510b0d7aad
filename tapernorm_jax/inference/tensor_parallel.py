"""Serving split over a `tensor` mesh axis (Megatron-style), for a model whose weights do not fit on one chip.

Each device of a `tensor` group holds a share of every block: the QKV and MLP-input projections split by their
output columns (heads, MLP units), the attention-output and MLP-output projections by their input rows, and
everything else (embeddings, norms, biases of the residual stream, the head) whole. A block then needs one
all-reduce of the B×T×D activation after each row-split projection (`projection`), and no weight moves between
chips. The KV cache splits with the heads: each device keeps the rows of its own heads, B_local·H/t of them, laid
out b-major as `model/kv_cache.py` lays out one device's rows, so the global cache is those blocks one after the
other, (rows, tensor)-major, read and written only inside the split program. Rows split over the mesh's `rows` axis.

An MLP width that does not divide over the `tensor` axis is padded (`pad`): units whose input columns and output
rows are zero add nothing to any output (the 1.2B preset's F = 5461 splits four ways as 5464).

Inside `jax.shard_map` every device runs the model's own prefill and decode step on its share (`local_config`: H/t
heads of the full width K, F/t MLP units): the numerics are the one-device model's but for the order of the
all-reduce's sums (`tests/inference/test_tensor_parallel.py`).
"""

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tapernorm_jax.inference import decode
from tapernorm_jax.model import ModelConfig, abstract_variables, param_paths, seams

Array = jax.Array
PyTree = Any
ROWS, TENSOR = "rows", "tensor"
RULES = (("heads", TENSOR), ("mlp", TENSOR))  # the split logical axes; every other one whole
ROW_SPLIT = (param_paths.ATTN_OUT, param_paths.WO)  # the projections that contract a split axis: summed over TENSOR


def make_mesh(devices: Sequence[Any], tensor: int) -> Mesh:
  """A (rows, tensor) mesh over `devices`: groups of `tensor` consecutive devices share one copy of the model."""
  if tensor < 1 or len(devices) % tensor:
    raise ValueError(f"tensor={tensor} must be a positive divisor of the device count ({len(devices)})")
  return Mesh(np.asarray(devices, dtype=object).reshape(-1, tensor), (ROWS, TENSOR))


def check(cfg: ModelConfig, mesh: Mesh, batch: int = 0) -> None:
  """Raises ValueError unless the heads and MLP units (`pad` them) split evenly over the mesh's `tensor` axis and
  `batch` rows over its `rows` axis."""
  tensor, rows = mesh.shape[TENSOR], mesh.shape[ROWS]
  if cfg.H % tensor:
    raise ValueError(f"model.H={cfg.H} does not split over tensor={tensor} devices; choose a divisor of it")
  if cfg.mlp_dim % tensor:
    raise ValueError(f"model.F={cfg.mlp_dim} does not split over tensor={tensor} devices; pad it first (pad)")
  if batch % rows:
    raise ValueError(f"batch={batch} rows do not split over the mesh's {rows} row groups; use a multiple of {rows}")


def padded_config(cfg: ModelConfig, tensor: int) -> ModelConfig:
  """`cfg` with its MLP width rounded up to a multiple of `tensor`."""
  return cfg.replace(F=-(-cfg.mlp_dim // tensor) * tensor)


def pad(variables: PyTree, cfg: ModelConfig, tensor: int) -> tuple[PyTree, ModelConfig]:
  """(`variables` with every MLP axis zero-padded to `padded_config`'s width, that config): the same model."""
  wide = padded_config(cfg, tensor)
  extra = wide.mlp_dim - cfg.mlp_dim
  logical = nn.get_partition_spec(abstract_variables(cfg))

  def widen(x: Array, spec: P) -> Array:
    if not extra or "mlp" not in spec:
      return x
    return jnp.pad(x, [(0, extra if name == "mlp" else 0) for name in spec])

  return jax.tree.map(widen, nn.unbox(variables), logical, is_leaf=lambda x: isinstance(x, P)), wide


def local_config(cfg: ModelConfig, tensor: int) -> ModelConfig:
  """The model one device of a `tensor` group runs: H/t heads of the full width, F/t MLP units."""
  return cfg.replace(H=cfg.H // tensor, F=cfg.mlp_dim // tensor, head_dim=cfg.K)


def variable_shardings(cfg: ModelConfig, mesh: Mesh) -> PyTree:
  """Each variable's NamedSharding on a (rows, tensor) mesh: its heads or MLP axis split over `tensor`."""
  check(cfg, mesh)
  return nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract_variables(cfg)), mesh, RULES)


def cache_sharding(mesh: Mesh) -> NamedSharding:
  """Every cache array's rows split over (rows, tensor): each device its rows' own heads."""
  return NamedSharding(mesh, P((ROWS, TENSOR)))


def projection(module: nn.Module, name: str, spec: str, x: Array, w: Array, part: slice | None = None) -> Array:
  """The model's einsum, summed over the `tensor` axis where it contracts a split axis (before any bias is added)."""
  y = seams.einsum(module, name, spec, x, w, part)
  return jax.lax.psum(y, TENSOR) if name in ROW_SPLIT else y


def _split(fn: Any, cfg: ModelConfig, mesh: Mesh, cache: PyTree) -> Any:
  """`fn(variables, cfg, a_B…, b_B…, cache, projection=…)` run per device on its share of a (rows, tensor) mesh."""
  local = local_config(cfg, mesh.shape[TENSOR])
  cache_spec = jax.tree.map(lambda _: P((ROWS, TENSOR)), cache)
  return jax.shard_map(
    lambda variables, a, b, cache: fn(variables, local, a, b, cache, projection=projection),
    mesh=mesh,
    in_specs=(jax.tree.map(lambda s: s.spec, variable_shardings(cfg, mesh)), P(ROWS), P(ROWS), cache_spec),
    out_specs=(P(ROWS), cache_spec),
    check_vma=False,
  )


def prefill(
  variables: PyTree, cfg: ModelConfig, prompt_BxP: Array, lengths_B: Array, cache: decode.Cache, mesh: Mesh
) -> tuple[Array, decode.Cache]:
  """`decode.prefill` on a (rows, tensor) mesh; `cache` from `init_cache`."""
  check(cfg, mesh, prompt_BxP.shape[0])
  return _split(decode.prefill, cfg, mesh, cache)(variables, prompt_BxP, lengths_B, cache)


def decode_step(
  variables: PyTree, cfg: ModelConfig, tokens_B: Array, index_B: Array, cache: decode.Cache, mesh: Mesh
) -> tuple[Array, decode.Cache]:
  """`decode.decode_step` on a (rows, tensor) mesh."""
  check(cfg, mesh, tokens_B.shape[0])
  return _split(decode.decode_step, cfg, mesh, cache)(variables, tokens_B, index_B, cache)


def init_cache(cfg: ModelConfig, batch: int, length: int, mesh: Mesh, dtype: Any = None) -> decode.Cache:
  """A zeroed cache for `batch` rows on `mesh`, each device holding its rows' own heads."""
  check(cfg, mesh, batch)
  shapes = jax.eval_shape(lambda: decode.init_cache(cfg, batch, length, dtype))
  placed = cache_sharding(mesh)
  return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype, device=placed), shapes)
