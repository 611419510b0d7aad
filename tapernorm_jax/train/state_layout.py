"""The train state's two layouts: blocks per layer (`block_0` … `block_{L−1}`), or, in a scanned run, parameters and
optimiser state stacked on a leading layer axis (`layer_scan.STACKED`), so the step updates a few stacked leaves.

The calibration constants stay per layer in both. A checkpoint holds whichever layout its run kept, and restores
into the other (`checkpoint.Checkpointer.restore`), so a run may resume with `model.scan_layers` changed."""

from typing import Any

from tapernorm_jax.model import layer_scan

State = dict[str, Any]
STACKABLE = ("params", "opt_state")  # what a scanned run keeps stacked


def is_stacked(state: State) -> bool:
  """Whether `state` (or a tree of its shardings or shapes) keeps its blocks stacked."""
  return layer_scan.STACKED in state.get("params", {})


def convert(state: State, L: int, stacked: bool) -> State:
  """`state` in the layout `stacked` names (unchanged where it is in it already)."""
  to_layout = layer_scan.stack_blocks if stacked else layer_scan.unstack_blocks
  return {**state, **{key: to_layout(state[key], L) for key in STACKABLE}}


def placement(shardings: State, L: int, stacked: bool) -> State:
  """The shardings of `convert(state, L, stacked)` from those of `state`."""
  to_layout = layer_scan.stacked_placement if stacked else layer_scan.unstacked_placement
  return {**shardings, **{key: to_layout(shardings[key], L) for key in STACKABLE}}
