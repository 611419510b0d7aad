"""Fine-tune GPT-2 with TaperLN or FakeLN (docs/method.md §10).

    python -m experiments.gpt2_finetune --config=configs/gpt2.py:model=s,variant=internal_taper --workdir=DIR

Starts from the pretrained model `init_from` names (a Hugging Face directory or hub name), trains
with the method's schedule, evaluates every set at g = 0 and writes the same run directory as
`experiments.tinystories` (resumable). A run whose norms are still LayerNorms (variant=baseline)
also writes `<workdir>/hf`, a Hugging Face GPT-2 directory that `transformers` and `init_from` load.
"""

import os

from absl import flags
import jax

from tapernorm_jax import cli
from tapernorm_jax.storage import run_files
from tapernorm_jax.hf import gpt2
from tapernorm_jax.inference import loading

_CONFIG = cli.define_config_file(
  "config", "configs/gpt2.py", "configs/gpt2.py with model=, variant=, seed=.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/gpt2-<model>-<method>-seed<N>).")
_STOP_AFTER = flags.DEFINE_integer("stop_after", None, "Save and exit after this step (simulates preemption).")


def default_workdir(cfg) -> str:
  """runs/gpt2-<model>-<method>-seed<N>, or runs/gpt2_demo/pretrain for the demo's starting model."""
  if cfg.size == "demo" and not cfg.init_from:
    return os.path.join("runs", "gpt2_demo", "pretrain")
  return os.path.join("runs", f"gpt2-{cfg.size}-{cfg.variant}-seed{cfg.seed}")


def main(argv: list[str]) -> None:
  """Entry point; a finished LayerNorm model is also written as a Hugging Face GPT-2 directory."""
  cfg = _CONFIG.value
  workdir = _WORKDIR.value or default_workdir(cfg)
  results = cli.train(argv, cfg, workdir, _STOP_AFTER.value)
  if jax.process_index() == 0 and results["complete"] and cfg.model.internal_norm == cfg.model.final_norm == "plain":
    loaded = loading.load(workdir)
    out = gpt2.save_gpt2(loaded.variables, loaded.model_cfg, run_files.workdir_path(workdir) / "hf")
    print(f"Hugging Face GPT-2 directory: {out}")


if __name__ == "__main__":
  cli.run(main)
