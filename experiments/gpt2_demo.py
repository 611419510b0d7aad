"""The GPT-2 fine-tuning path at CPU scale, end to end: `python -m experiments.gpt2_demo [--seeds=0,1]`.

Real GPT-2 weights need a download; this shows every step on what runs offline: pretrain a small
GPT-2-shaped model (LayerNorm, learned positions, GELU; 4 layers, d = 64) as `baseline` on the
offline corpus, save it in the Hugging Face layout, load it back through `tapernorm_jax.hf.gpt2.load_gpt2`, fine-tune
it with every method from that same start, and the plain fine-tune with the scale loss (the tapered variants'
matched control), and write a table shaped like the paper's GPT-2 table (validation loss at g = 0 before and after,
mean ± std over seeds) to --out.
"""

import json
import os
import statistics

from absl import app, flags, logging

from configs import base, gpt2
from tapernorm_jax import cli
from tapernorm_jax.files import write_text_atomically
from tapernorm_jax.hf import gpt2 as hf_gpt2
from tapernorm_jax.inference import loading
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.train import loop

ROWS = (("baseline", 0), ("baseline", 1), ("internal_taper", 1), ("all_taper", 1), ("fakeln", 1))  # (variant, aux)
_WORKDIR = flags.DEFINE_string("workdir", "runs/gpt2_demo", "Where the pretraining and fine-tuning runs go.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "Fine-tuning seeds per variant.")
_OUT = flags.DEFINE_string("out", "docs/gpt2_demo.md", "The markdown table.")


def results_of(cfg, workdir: str) -> dict:
  """Runs (or resumes, or just reads) one run."""
  path = os.path.join(workdir, "results.json")
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  return loop.run(cfg, workdir)


def main(argv: list[str]) -> None:
  """Pretrain, save as Hugging Face GPT-2, fine-tune every variant, tabulate."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _SEEDS.value or not all(seed.isdigit() for seed in _SEEDS.value):
    raise app.UsageError(f"--seeds={','.join(_SEEDS.value)}: give comma-separated non-negative integers, e.g. 0,1")
  logging.set_verbosity(logging.WARNING)
  pre_dir, hf_dir = os.path.join(_WORKDIR.value, "pretrain"), os.path.join(_WORKDIR.value, "pretrain", "hf")
  before = results_of(gpt2.get_config("model=demo,variant=baseline,pretrain=1"), pre_dir)
  if not os.path.exists(os.path.join(hf_dir, hf_gpt2.CONFIG_FILE)):
    loaded = loading.load(pre_dir)
    hf_gpt2.save_gpt2(loaded.variables, loaded.model_cfg, hf_dir)
  rows, lines = [], {}
  for variant, aux in ROWS:
    finals = []
    for seed in _SEEDS.value:
      cfg = base.override(gpt2.get_config(f"model=demo,variant={variant},aux={aux},seed={seed}"),
                          {"init_from": hf_dir})
      finals.append(results_of(cfg, os.path.join(_WORKDIR.value, f"{variant}-aux{aux}-seed{seed}"))["final_val_loss"])
    name = f"{variant} (+aux)" if aux and variant != "fakeln" else variant  # FakeLN's aux loss is its own
    lines[name] = finals
    spread = f" ± {statistics.stdev(finals):.4f}" if len(finals) > 1 else ""
    rows.append([name, f"{before['final_val_loss']:.4f}", f"{statistics.mean(finals):.4f}{spread}",
                 f"{statistics.mean(finals) - before['final_val_loss']:+.4f}", len(finals)])
  cfg = gpt2.get_config("model=demo")
  table = "\n".join([
      f"Validation cross-entropy (nats/token, g = 0) of the demo model ({before['params']:,} parameters, "
      f"{before['corpus']}), pretrained {before['steps']} steps as baseline, then fine-tuned {cfg.train.steps} "
      f"steps of {cfg.train.batch_size} × {cfg.model.T} tokens from the same start; mean ± std over seeds "
      f"{', '.join(_SEEDS.value)}.", "",
      markdown_table(["variant", "before", "after", "change", "seeds"], rows), "",
      "Per seed: " + "; ".join(f"{m} " + ", ".join(f"{x:.4f}" for x in v) for m, v in lines.items()) + "."])
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  write_text_atomically(_OUT.value, table + "\n")
  print(table)


if __name__ == "__main__":
  cli.run(main)
