"""Orbax checkpoints of the whole run: train state (params, optimiser, calib, step) and data iterator.

A checkpoint that Orbax lists as complete but cannot read back (a file truncated or deleted
inside it) raises `DamagedCheckpointError` naming the step, the directory and the newest other
checkpoint. `restore_latest(..., fallback=True)` then resumes from the newest one that does
restore and moves the damaged ones aside (`<step>.damaged-<time>`, never deleted). With several processes they
agree: each checkpoint carries `manifest.json` (its files' sizes and hashes, written by process 0 once the save is
complete), every process checks it before Orbax reads anything, a step is restored only when no process found damage,
process 0 moves a damaged step aside, and the others wait for the move before listing the directory again.

The directory may be local or a URL (`gs://bucket/run/checkpoints`): every path is an `etils.epath.Path`, which
Orbax takes as it is.
"""

import os
import time
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from tapernorm_jax.model import layer_scan
from tapernorm_jax.storage import run_files, integrity
from tapernorm_jax.storage.saved_keys import saved_keys
from tapernorm_jax.train import state_layout
from tapernorm_jax.storage.unreadable import DamagedCheckpointError, quiet_aborted_reads, read_error

PyTree = Any
LEGACY_KEY = ("rng",)  # every 0.1 train state carried an (unused) RNG; later ones do not
ON_DAMAGED = ("stop", "fallback")  # checkpoint.on_damaged: what a resume does when the latest checkpoint is damaged
REQUIRED_FILES = ("state/_METADATA", "state/manifest.ocdbt", "data/metadata")  # what every restore reads first
SAVE_SPARE_BYTES = 1 << 20  # free space a save leaves beyond the state's bytes: metrics, events, Orbax's metadata


def abstract_array(x: Any, sharding: jax.sharding.Sharding) -> jax.ShapeDtypeStruct:
  """`x`'s shape and dtype placed by `sharding` (a restore target's leaf)."""
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def every_process(ok: bool) -> bool:
  """Whether `ok` holds on every process (with several, a collective: each of them must call it)."""
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


class Restored(NamedTuple):
  """What `restore_latest` found: the step, the state and data state, and where damaged steps were moved."""

  step: int
  state: PyTree
  data_state: Any
  moved: list[tuple[int, str, str]]  # (step, reason, new path) of every damaged checkpoint moved aside


class Checkpointer:
  """Saves asynchronously, keeps the last `keep`; only complete checkpoints are ever listed or restored."""

  def __init__(self, directory: str | os.PathLike, keep: int = 3):
    self.directory = run_files.workdir_path(directory)
    # create=False: the directory appears with the first save, so a run that fails before saving leaves none.
    # Directories are created before save() returns: created in the background, two managers of one process (the
    # sweep's cells running side by side) saving the same step take each other's completion signal, and one
    # writes into a directory that does not exist yet (FileNotFoundError, Orbax 0.12.8).
    options = ocp.CheckpointManagerOptions(
      max_to_keep=keep,
      create=False,
      cleanup_tmp_directories=True,
      async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
    )
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._saving: tuple[str, int | None] = ("no checkpoint", None)  # the save in flight, and the bytes it needs

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Steps of every complete checkpoint, oldest first."""
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: PyTree, data_state: Any) -> None:
    """Starts an asynchronous save of `state` and the data iterator state at `step` (once the previous one is
    complete and recorded)."""
    self.record_complete()
    self._saving = (f"the checkpoint at step {step}", sum(x.nbytes for x in jax.tree.leaves(state)))
    # Checked before Orbax starts: a disk that fills under its writer threads prints their tracebacks. The spare
    # bytes are for what the run writes until the next save (metrics, events) and Orbax's own metadata.
    free = run_files.free_bytes(self.directory)  # None for a URL: not checked
    if not every_process(free is None or free >= self._saving[1] + SAVE_SPARE_BYTES):
      needs = f"{run_files.in_bytes(self._saving[1])} and {run_files.in_bytes(SAVE_SPARE_BYTES)} spare"
      raise run_files.DiskFullError(run_files.full_disk_message(self._saving[0], self.directory, needs, free))
    with run_files.full_disk_named(self._saving[0], self.directory, self._saving[1]):
      self.directory.mkdir(parents=True, exist_ok=True)
      self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)),
        force=True,
      )

  def restore(self, step: int, target: PyTree) -> tuple[PyTree, Any]:
    """Restores (state, data state) at `step` onto `target`'s shapes, dtypes and shardings; a checkpoint that cannot
    be read raises DamagedCheckpointError."""
    keys = self.check_layout(step)
    shardings = jax.tree.map(lambda x: x.sharding, target)
    abstract = jax.tree.map(abstract_array, target, shardings)
    saved_stacked = None if keys is None else layer_scan.stacked_in(keys)
    stacked = state_layout.is_stacked(target)
    converted = saved_stacked is not None and saved_stacked != stacked  # saved by a run that scanned otherwise
    if converted:
      L = layer_scan.depth(target["params"])
      saved_shapes = jax.eval_shape(lambda t: state_layout.convert(t, L, saved_stacked), abstract)
      abstract = jax.tree.map(abstract_array, saved_shapes, state_layout.placement(shardings, L, saved_stacked))
    step_dir = self.directory / str(step)
    missing = [name for name in REQUIRED_FILES if not (step_dir / name).exists()]
    problem = (
      f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing" if missing else integrity.check(step_dir)
    )
    if not every_process(not problem):  # before Orbax's own collectives: every process restores this step, or none
      raise self.damaged(step, problem or "another process found a file of it damaged")
    quiet_aborted_reads()
    try:
      restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore())
      )
    except Exception as e:  # TensorStore, JSON and Orbax errors: the files of this step are not what was written
      raise self.damaged(step, read_error(e, os.fspath(step_dir))) from e
    if converted:
      to_target = jax.jit(lambda state: state_layout.convert(state, L, stacked), out_shardings=shardings)
      return to_target(restored["state"]), restored["data"]
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
        damaged[0].step,
        damaged[0].reason,
      )
    return None

  def damaged(self, step: int, reason: str) -> DamagedCheckpointError:
    """The error for a checkpoint at `step` that cannot be read, naming the fix."""
    older = [s for s in self.all_steps() if s < step]
    fix = (
      f"The newest other checkpoint is step {older[-1]}: to resume from it, re-run with "
      f"--config.checkpoint.on_damaged=fallback (step {step} is then moved aside to {step}.damaged-<time>, "
      "not deleted)"
      if older
      else f"There is no older checkpoint: move {self.directory / str(step)} away to start over, or use a new --workdir"
    )
    return DamagedCheckpointError(
      f"the checkpoint at step {step} in {self.directory} is damaged: {reason}. {fix}.", step, reason
    )

  def move_aside(self, step: int) -> str:
    """Renames the checkpoint at `step` to `<step>.damaged-<time>` (kept for inspection); returns the new path."""
    source = self.directory / str(step)
    target = source.parent / f"{step}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    if jax.process_index() == 0:
      source.rename(target)
    if jax.process_count() > 1:  # the others list the directory again only once it is moved
      multihost_utils.sync_global_devices(f"tapernorm_jax: checkpoint {step} moved aside")
    self._manager.reload()
    return os.fspath(target)

  def saved_stacked(self, step: int) -> bool | None:
    """Whether the state at `step` was saved with its blocks stacked (`state_layout.py`); None where unknown."""
    keys = saved_keys(self.directory / str(step) / "state")
    return None if keys is None else layer_scan.stacked_in(keys)

  def check_layout(self, step: int) -> list[tuple[str, ...]] | None:
    """The paths the state at `step` holds (None where its metadata cannot be read: restore() reports the damage);
    ValueError for a checkpoint written before the norm parameters were renamed (tapernorm_jax 0.1)."""
    keys = saved_keys(self.directory / str(step) / "state")
    if keys is not None and LEGACY_KEY in keys:
      raise ValueError(
        f"the checkpoint at step {step} in {self.directory} was written by tapernorm_jax 0.1, whose "
        "norm parameters were named scale/scale_tilde/bias (now gamma/gamma_tilde/beta); this "
        "version cannot resume it. Start the run in a new --workdir."
      )
    return keys

  def record_complete(self) -> None:
    """Waits for pending saves; then process 0 writes `<step>/manifest.json` (every file's size and SHA-256) for each
    complete checkpoint that has none, so that damage found later is named before Orbax reads it. A save that found
    the disk full raises run_files.DiskFullError; the checkpoints complete before it stay complete."""
    with run_files.full_disk_named(self._saving[0], self.directory, self._saving[1]):
      self._manager.wait_until_finished()
    if jax.process_index() != 0:
      return
    for step in self.all_steps():
      try:
        if not (self.directory / str(step) / integrity.MANIFEST).exists():
          integrity.record(self.directory / str(step))
      except FileNotFoundError:  # removed meanwhile (max_to_keep)
        continue

  def wait(self) -> None:
    """Blocks until pending saves are on disk and recorded."""
    self.record_complete()

  def close(self) -> None:
    """Waits for pending saves, records them and releases the manager."""
    self.record_complete()
    self._manager.close()
