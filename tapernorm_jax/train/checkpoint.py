"""Orbax checkpoints of the whole run: train state (params, optimiser, calib, step) and data iterator.

A checkpoint that Orbax lists as complete but cannot read back (a file truncated or deleted
inside it) raises `DamagedCheckpointError` naming the step, the directory and the newest other
checkpoint. `restore_latest(..., fallback=True)` then resumes from the newest one that does
restore and moves the damaged ones aside (`<step>.damaged-<time>`, never deleted).

The directory may be local or a URL (`gs://bucket/run/checkpoints`): every path is an `etils.epath.Path`, which
Orbax takes as it is.
"""

import json
import os
import time
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp

from tapernorm_jax import files
from tapernorm_jax.damaged import DamagedCheckpointError, quiet_aborted_reads, read_error

PyTree = Any
LEGACY_KEY = "('rng',)"  # every 0.1 train state carried an (unused) RNG; later ones do not
ON_DAMAGED = ("stop", "fallback")  # checkpoint.on_damaged: what a resume does when the latest checkpoint is damaged
REQUIRED_FILES = ("state/_METADATA", "state/manifest.ocdbt", "data/metadata")  # what every restore reads first


class Restored(NamedTuple):
  """What `restore_latest` found: the step, the state and data state, and where damaged steps were moved."""

  step: int
  state: PyTree
  data_state: Any
  moved: list[tuple[int, str, str]]  # (step, reason, new path) of every damaged checkpoint moved aside


class Checkpointer:
  """Saves asynchronously, keeps the last `keep`; only complete checkpoints are ever listed or restored."""

  def __init__(self, directory: str | os.PathLike, keep: int = 3):
    self.directory = files.workdir_path(directory)
    # create=False: the directory appears with the first save, so a run that fails before saving leaves none
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=False, cleanup_tmp_directories=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Steps of every complete checkpoint, oldest first."""
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: PyTree, data_state: Any) -> None:
    """Starts an asynchronous save of `state` and the data iterator state at `step`."""
    self.directory.mkdir(parents=True, exist_ok=True)
    self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     data=ocp.args.JsonSave(data_state)), force=True)

  def restore(self, step: int, target: PyTree) -> tuple[PyTree, Any]:
    """Restores (state, data state) at `step` onto `target`'s shapes, dtypes and shardings; a checkpoint that cannot
    be read raises DamagedCheckpointError."""
    self.check_layout(step)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target)
    step_dir = self.directory / str(step)
    missing = [name for name in REQUIRED_FILES if not (step_dir / name).exists()]
    if missing:
      raise self.damaged(step, f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing")
    quiet_aborted_reads()
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                     data=ocp.args.JsonRestore()))
    except Exception as e:  # TensorStore, JSON and Orbax errors: the files of this step are not what was written
      raise self.damaged(step, read_error(e, os.fspath(step_dir))) from e
    return restored["state"], restored["data"]

  def restore_latest(self, target: PyTree, fallback: bool = False) -> Restored | None:
    """The newest checkpoint restored (None when there is none). A damaged one raises DamagedCheckpointError; with
    `fallback`, the newest one that restores is used instead and the damaged newer ones are moved aside."""
    steps, damaged = self.all_steps(), []
    for step in reversed(steps):
      try:
        state, data_state = self.restore(step, target)
      except DamagedCheckpointError as e:
        if not fallback:
          raise
        damaged.append(e)
        continue
      return Restored(step, state, data_state, [(e.step, e.reason, self.move_aside(e.step)) for e in damaged])
    if damaged:
      raise DamagedCheckpointError(
          f"no checkpoint in {self.directory} can be restored (steps {', '.join(str(e.step) for e in damaged)}; "
          f"step {damaged[0].step}: {damaged[0].reason}); nothing was moved. Damage to every checkpoint usually means "
          "the code that reads them changed: use that version, or start over in a new --workdir",
          damaged[0].step, damaged[0].reason)
    return None

  def damaged(self, step: int, reason: str) -> DamagedCheckpointError:
    """The error for a checkpoint at `step` that cannot be read, naming the fix."""
    older = [s for s in self.all_steps() if s < step]
    fix = (f"The newest other checkpoint is step {older[-1]}: to resume from it, re-run with "
           f"--config.checkpoint.on_damaged=fallback (step {step} is then moved aside to {step}.damaged-<time>, "
           "not deleted)" if older else
           f"There is no older checkpoint: move {self.directory / str(step)} away to start over, or "
           "use a new --workdir")
    return DamagedCheckpointError(f"the checkpoint at step {step} in {self.directory} is damaged: {reason}. {fix}.",
                                  step, reason)

  def move_aside(self, step: int) -> str:
    """Renames the checkpoint at `step` to `<step>.damaged-<time>` (kept for inspection); returns the new path."""
    source = self.directory / str(step)
    target = source.parent / f"{step}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    if jax.process_index() == 0:
      source.rename(target)
    self._manager.reload()
    return os.fspath(target)

  def check_layout(self, step: int) -> None:
    """Raises ValueError for a checkpoint written before the norm parameters were renamed (tapernorm_jax 0.1)."""
    path = self.directory / str(step) / "state" / "_METADATA"
    if path.exists():
      try:
        keys = json.loads(path.read_text()).get("tree_metadata", {})
      except ValueError:  # truncated: restore() reports it as damage
        return
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
