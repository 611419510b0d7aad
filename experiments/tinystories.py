"""Train a TinyStories variant: `python -m experiments.tinystories --config=configs/all_taper.py[:size=9m,...]`.

Trains, evaluates at g = 0 and writes results.json, metrics.jsonl, TensorBoard events, the
resolved config and checkpoints to --workdir; running the same command again resumes.
"""

import json
import os

from absl import app, flags, logging
import jax

from tapernorm_jax import cli, loop

_CONFIG = cli.define_config_file("config", "configs/all_taper.py", "Variant config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<variant>-<size>-aux<0|1>-seed<N>).")
_STOP_AFTER = flags.DEFINE_integer("stop_after", None, "Save and exit after this step (simulates preemption).")


def default_workdir(cfg) -> str:
  """runs/<variant>-<size>-aux<0|1>-seed<N>."""
  return os.path.join("runs", f"{cfg.variant}-{cfg.size}-aux{int(cfg.taper.aux_weight > 0)}-seed{cfg.seed}")


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _STOP_AFTER.value is not None and _STOP_AFTER.value < 1:
    raise app.UsageError(f"--stop_after={_STOP_AFTER.value}: must be a step >= 1 (leave it out to train to the end)")
  cfg = _CONFIG.value
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save step at INFO; our own progress goes to the bar
  if cfg.mesh.distributed:
    jax.distributed.initialize()
  workdir = _WORKDIR.value or default_workdir(cfg)
  results = loop.run(cfg, workdir, stop_after=_STOP_AFTER.value)
  if jax.process_index() == 0:
    print(json.dumps(results, indent=2))
    print(f"run directory: {os.path.abspath(workdir)}")


if __name__ == "__main__":
  cli.run(main)
