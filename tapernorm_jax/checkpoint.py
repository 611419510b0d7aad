"""Orbax checkpoints of the whole run: train state (params, optimiser, calib, step) and data iterator."""

import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

PyTree = Any
LEGACY_KEY = "('rng',)"  # every 0.1 train state carried an (unused) RNG; later ones do not


class Checkpointer:
  """Saves asynchronously, keeps the last `keep`; only complete checkpoints are ever listed or restored."""

  def __init__(self, directory: str, keep: int = 3):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, cleanup_tmp_directories=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Steps of every complete checkpoint, oldest first."""
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: PyTree, data_state: Any) -> None:
    """Starts an asynchronous save of `state` and the data iterator state at `step`."""
    self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     data=ocp.args.JsonSave(data_state)), force=True)

  def restore(self, step: int, target: PyTree) -> tuple[PyTree, Any]:
    """Restores (state, data state) at `step` onto `target`'s shapes, dtypes and shardings."""
    self.check_layout(step)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target)
    restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                   data=ocp.args.JsonRestore()))
    return restored["state"], restored["data"]

  def check_layout(self, step: int) -> None:
    """Raises ValueError for a checkpoint written before the norm parameters were renamed (tapernorm_jax 0.1)."""
    path = os.path.join(self.directory, str(step), "state", "_METADATA")
    if os.path.exists(path):
      with open(path) as f:
        keys = json.load(f).get("tree_metadata", {})
      if LEGACY_KEY in keys:
        raise ValueError(f"the checkpoint at step {step} in {self.directory} was written by tapernorm_jax 0.1, whose "
                         "norm parameters were named scale/scale_tilde/bias (now gamma/gamma_tilde/beta); this "
                         "version cannot resume it. Start the run in a new --workdir.")

  def wait(self) -> None:
    """Blocks until pending saves are on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases the manager."""
    self._manager.close()
