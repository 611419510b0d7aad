"""A trained model ready to run: a training run's latest (or chosen) checkpoint with its tokenizer, or an export.

loaded = loading.load("runs/x")   # variables, model config and tokenizer; local or a URL
"""

import dataclasses
import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from tapernorm_jax import config_fields
from tapernorm_jax.storage import unreadable, run_files
from tapernorm_jax.storage.saved_keys import saved_keys
from tapernorm_jax.inference import export
from tapernorm_jax.model import ModelConfig, layer_scan

PyTree = Any


@dataclasses.dataclass
class Loaded:
  """A model ready to run: variables, config and tokenizer (if any)."""

  variables: PyTree
  model_cfg: ModelConfig
  tokenizer: Any | None


def load_checkpoint(workdir: str | os.PathLike, step: int | None = None) -> tuple[PyTree, dict]:
  """Restores only {"params", "calib"} of the `state` item at `step` (default: latest) of a run directory, local or
  remote; returns (variables, config)."""
  workdir = run_files.workdir_path(workdir)
  config_path = workdir / "config.json"
  if not config_path.is_file():
    raise FileNotFoundError(f"{config_path} not found: --workdir must be a training run or an export directory")
  run_cfg = config_fields.upgrade(json.loads(config_path.read_text()))
  model_cfg = ModelConfig.from_config(run_cfg["model"])
  directory = workdir / "checkpoints"
  with ocp.CheckpointManager(directory) as manager:
    steps = sorted(manager.all_steps())
    step = manager.latest_step() if step is None else step
    if step is None or step not in steps:
      raise FileNotFoundError(
        f"no checkpoint {'at step ' + str(step) if step is not None else ''} in {directory} (steps: {steps})"
      )
    target = export.restore_target(model_cfg)
    keys = saved_keys(directory / str(step) / "state")
    if keys is not None and layer_scan.stacked_in(keys):  # a scanned run's (train/state_layout.py): read per layer
      target = {**target, "params": stacked_target(target["params"], model_cfg.L)}
    unreadable.quiet_aborted_reads()
    try:
      restored = manager.restore(
        step,
        args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
          )
        ),
      )
    except Exception as e:  # TensorStore, JSON and Orbax errors: the files of this step are not what was written
      older = [s for s in steps if s < step]
      fix = f"load an older one with --step={older[-1]}" if older else "there is no older checkpoint"
      reason = unreadable.read_error(e, os.fspath(directory / str(step)))
      raise unreadable.DamagedCheckpointError(
        f"the checkpoint at step {step} in {directory} is damaged: {reason}; {fix}", step, reason
      ) from e
  variables = dict(restored["state"])
  variables["params"] = layer_scan.unstack_blocks(variables["params"], model_cfg.L)
  return variables, {**run_cfg, "restored_step": step}


def stacked_target(params: PyTree, L: int) -> PyTree:
  """A restore target of per-layer `params` (each leaf on one device) with its blocks stacked, on that device."""
  placement = jax.tree.leaves(params)[0].sharding
  shapes = jax.eval_shape(lambda p: layer_scan.stack_blocks(p, L), params)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placement), shapes)


def run_tokenizer(run_cfg: dict) -> Any | None:
  """The training run's tokenizer through `tapernorm_jax.data.prepare` (None when it cannot be prepared)."""
  try:
    from tapernorm_jax import data  # the training data stack: only when a run directory is loaded

    prepared = data.prepare(run_cfg["data"])
  except Exception as e:  # the model still runs on token ids
    print(f"(no tokenizer: {type(e).__name__}: {e}; pass token ids)")
    return None
  return prepared.tokenizer


def load(path: str | os.PathLike, step: int | None = None) -> Loaded:
  """Loads an export directory, or a training run's checkpoint with its tokenizer (either local or a URL)."""
  if export.is_export(path):
    exported = export.load(path)
    return Loaded(exported.variables, exported.model_cfg, export.load_tokenizer(exported))
  variables, run_cfg = load_checkpoint(path, step)
  return Loaded(variables, ModelConfig.from_config(run_cfg["model"]), run_tokenizer(run_cfg))
