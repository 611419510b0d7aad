"""Train a TinyStories variant: `python -m experiments.tinystories --config=configs/all_taper.py[:size=9m,...]`.

Trains, evaluates at g = 0 and writes results.json, metrics.jsonl, TensorBoard events, the
resolved config and checkpoints to --workdir; running the same command again resumes.
"""

import os

from absl import flags

from tapernorm_jax import cli
from tapernorm_jax.taper import methods

_CONFIG = cli.define_config_file("config", "configs/all_taper.py", "Variant config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<variant>-<size>-aux<0|1>-seed<N>).")
_STOP_AFTER = flags.DEFINE_integer("stop_after", None, "Save and exit after this step (simulates preemption).")


def default_workdir(cfg) -> str:
  """runs/<variant>-<size>-aux<0|1>-seed<N>."""
  return os.path.join("runs", f"{cfg.variant}-{cfg.size}-aux{int(methods.scale_loss_weight(cfg) > 0)}-seed{cfg.seed}")


def main(argv: list[str]) -> None:
  """Entry point."""
  cfg = _CONFIG.value
  cli.train(argv, cfg, _WORKDIR.value or default_workdir(cfg), _STOP_AFTER.value)


if __name__ == "__main__":
  cli.run(main)
