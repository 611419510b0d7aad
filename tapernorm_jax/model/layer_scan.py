"""The L blocks run as one block under a scan (`model.scan_layers`), and what a block keeps for its backward pass
(`model.remat`).

Unrolled, a program holds L copies of the block, and the compiler works through each: GPT-2 XL's train step (48
blocks) took 4–6 minutes to compile for a TPU slice (docs/tpu.md). Scanned, it holds one. Inside the call the
blocks' variables are stacked on a leading layer axis, one `Block` is applied per trip of `jax.lax.scan` to that
layer's slice and gates, and the batch statistics its norms record come back as the loop's outputs, to be written
per block where the unrolled blocks write theirs. The model takes either tree: per layer (`block_0`, `block_1`, …),
stacked inside the call, or already stacked under `STACKED`.

Why `jax.lax.scan` over the functional `Block.apply` and not `nn.scan`: `nn.scan` keeps its variables stacked
under one name in its own scope, so the per-layer tree would need `nn.map_variables` around it to stack and
unstack every collection (and an `init` that makes the stacked form, then renames it). Here the three steps are
in plain sight — stack what the tree holds, apply one block per slice, hand back what each block wrote — and the
loop is the same `lax.scan` that `nn.scan` lowers to.

The stack keeps each weight's own mesh axes behind an unsharded layer axis (`sharding.stacked_shardings`), so FSDP
gathers one layer's weights per trip, as the unrolled program gathers them per block.

A scanned run also keeps its train state stacked (`stack_blocks`): the parameters and Adam's moments hold one
`STACKED` entry in place of `block_0` … `block_{L−1}`, so the step differentiates and updates a few stacked leaves.
On the per-layer tree, each of L × (a block's weights) leaves got its own clip, Adam and gradient-norm arithmetic
(64,554 of the 80,883 instructions of GPT-2 XL's scanned step), and stacking and splitting the tree inside the step
cost about 6,900 more (docs/tpu.md). The calibration constants stay per layer, and a calibration sees each block's
norms as their own entries (`with_blocks_unstacked`). Whatever reads a model — the fold, the Hugging Face conversion,
decoding, an export — reads the per-layer tree: `unstack_blocks` gives it, and a checkpoint in either layout restores
into the other (`train/checkpoint.py`, `inference/loading.py`).
"""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from tapernorm_jax.model import param_paths, sharding
from tapernorm_jax.model.gates import BlockGates, Gates
from tapernorm_jax.model.norms import CALIB_STATS

Array = jax.Array
PyTree = Any


def remat_policy(remat: str) -> Callable[..., bool] | None:
  """jax's saving policy for `model.remat`: None for `full` (nothing saved: the block is recomputed), and for
  `save_matmuls` the outputs of the products without batch dimensions — the projections', so only the cheap
  element-wise work is recomputed, while attention's B×H×T×T scores are not kept."""
  return jax.checkpoint_policies.dots_with_no_batch_dims_saveable if remat == "save_matmuls" else None


STACKED = "blocks"  # the entry that holds blocks 0 … L−1 stacked (L, …) in place of their per-layer entries


def stack(variables: PyTree, L: int) -> PyTree:
  """Every collection's blocks `block_0` … `block_{L−1}` as one tree whose leaves carry a leading layer axis (L, …),
  or the collection's `STACKED` entry where it holds them so already; the batch statistics (written, not read) are
  left out."""
  collections = {col: nn.unbox(tree) for col, tree in variables.items() if col != CALIB_STATS}
  return {
    col: stack_blocks(tree, L)[STACKED]
    for col, tree in collections.items()
    if STACKED in tree or param_paths.block(0) in tree
  }


def _holds_blocks(node: Any) -> bool:
  """Whether `node` is a dict with per-layer block entries."""
  return isinstance(node, dict) and param_paths.block(0) in node


def stack_blocks(tree: PyTree, L: int) -> PyTree:
  """`tree` (parameters, their gradients, an optimiser state, …) with each dict's `block_0` … `block_{L−1}` replaced
  by one `STACKED` entry whose leaves carry a leading layer axis; the inverse of `unstack_blocks`."""
  names = [param_paths.block(i) for i in range(L)]

  def node_stacked(node: Any) -> Any:
    if not _holds_blocks(node):
      return node
    rest = {key: value for key, value in node.items() if key not in names}
    return {**rest, STACKED: jax.tree.map(lambda *xs: jnp.stack(xs), *(node[name] for name in names))}

  return jax.tree.map(node_stacked, tree, is_leaf=_holds_blocks)


def unstack_blocks(tree: PyTree, L: int) -> PyTree:
  """`tree` with each dict's `STACKED` entry split back into `block_0` … `block_{L−1}`."""
  holds_stack = lambda node: isinstance(node, dict) and STACKED in node

  def node_unstacked(node: Any) -> Any:
    if not holds_stack(node):
      return node
    rest = {key: value for key, value in node.items() if key != STACKED}
    return {**rest, **dict(zip((param_paths.block(i) for i in range(L)), unstack(node[STACKED], L)))}

  return jax.tree.map(node_unstacked, tree, is_leaf=holds_stack)


def stacked_placement(shardings: PyTree, L: int) -> PyTree:
  """The NamedShardings of `stack_blocks(tree)` from those of `tree`: block 0's, behind an unsharded layer axis."""
  names = [param_paths.block(i) for i in range(L)]

  def node_stacked(node: Any) -> Any:
    if not _holds_blocks(node):
      return node
    rest = {key: value for key, value in node.items() if key not in names}
    return {**rest, STACKED: jax.tree.map(sharding.behind_layer_axis, node[param_paths.block(0)])}

  return jax.tree.map(node_stacked, shardings, is_leaf=_holds_blocks)


def unstacked_placement(shardings: PyTree, L: int) -> PyTree:
  """The NamedShardings of `unstack_blocks(tree)` from those of a stacked `tree`: each block the stack's, less its
  layer axis."""
  holds_stack = lambda node: isinstance(node, dict) and STACKED in node

  def node_unstacked(node: Any) -> Any:
    if not holds_stack(node):
      return node
    rest = {key: value for key, value in node.items() if key != STACKED}
    return {**rest, **{param_paths.block(i): jax.tree.map(sharding.within_layer, node[STACKED]) for i in range(L)}}

  return jax.tree.map(node_unstacked, shardings, is_leaf=holds_stack)


def stacked_in(saved_keys: list[tuple[str, ...]]) -> bool:
  """Whether a saved state whose leaves have the paths `saved_keys` holds its parameters stacked."""
  return any(key[:2] == ("params", STACKED) for key in saved_keys)


def depth(params: PyTree) -> int:
  """L of a parameter tree in either layout: its `STACKED` leaves' leading axis, or its number of blocks."""
  if STACKED in params:
    return jax.tree.leaves(params[STACKED])[0].shape[0]
  L = 0
  while param_paths.block(L) in params:
    L += 1
  return L


def with_blocks_unstacked(
  fn: Callable[..., tuple[PyTree, ...]], params: PyTree, names: set[str], *args: Any
) -> tuple[PyTree, ...]:
  """`fn(params, *args)` → (params, …) on a stacked `params`, `fn` seeing the entries `names` of each block as
  `block_i`'s own (what a calibration writes per norm); every other stacked leaf passes through untouched."""
  stack, L = params[STACKED], depth(params)
  unstacked = unstack_blocks({STACKED: {n: stack[n] for n in names if n in stack}}, L)
  view = {**{k: v for k, v in params.items() if k != STACKED}, **unstacked}
  out, *rest = fn(view, *args)
  restacked = stack_blocks(out, L)
  return ({**restacked, STACKED: {**stack, **restacked[STACKED]}}, *rest)


def layer_ndim(path: tuple, leaf: Any) -> int:
  """The number of axes of one layer's copy of `leaf`: its own, less the layer axis under a `STACKED` entry."""
  stacked = any(getattr(key, "key", None) == STACKED for key in path)
  return jnp.ndim(leaf) - int(stacked)


def unstack(stacked: PyTree, L: int) -> list[PyTree]:
  """The L per-block trees of a tree whose leaves carry a leading layer axis."""
  return [jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(L)]


def keep_sharding(layers: PyTree, block: nn.Module, inputs: tuple, mesh: Mesh | None) -> PyTree:
  """The stacked variables with their layout fixed on `mesh`: each leaf's own axes as the block's logical axis names
  place them (found by tracing the block's init on `inputs`' shapes), behind an unsharded layer axis."""
  if mesh is None or mesh.size == 1:
    return layers
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), inputs)
  boxed = jax.eval_shape(lambda *xs: block.init(jax.random.key(0), *xs), *shapes)
  placed = sharding.stacked_shardings(boxed, mesh)
  return {
    col: jax.lax.with_sharding_constraint(tree, placed[col]) if col in placed else tree for col, tree in layers.items()
  }


def scan(
  block: nn.Module,
  layers: PyTree,
  h_BxTxD: Array,
  positions_BxT: Array,
  gates: Gates,
  *,
  record: bool,
  remat: str,
  shard: Callable[[Array], Array],
) -> tuple[Array, PyTree]:
  """h after the L blocks, block i applied to slice i of `layers` with its gates (and `shard` applied to its
  output, as at every block boundary); with `record`, also the batch statistics each block writes, stacked (L, …)."""

  def body(h_BxTxD: Array, layer: tuple[PyTree, BlockGates]) -> tuple[Array, PyTree]:
    variables, block_gates = layer
    if not record:
      return shard(block.apply(variables, h_BxTxD, positions_BxT, block_gates)), {}
    h_BxTxD, mutated = block.apply(variables, h_BxTxD, positions_BxT, block_gates, mutable=[CALIB_STATS])
    return shard(h_BxTxD), mutated.get(CALIB_STATS, {})

  if remat != "none":  # one body, so no common subexpressions across blocks for remat to guard against
    body = jax.checkpoint(body, policy=remat_policy(remat), prevent_cse=False)
  return jax.lax.scan(body, h_BxTxD, (layers, BlockGates(gates.attn, gates.mlp, gates.attn_value)))
