"""The GPT-2 fine-tuning path at CPU scale, end to end: `python -m experiments.gpt2_demo [--seeds=0,1]`.

Real GPT-2 weights need a download; this shows every step on what runs offline: pretrain a small
GPT-2-shaped model (LayerNorm, learned positions, GELU; 4 layers, d = 64) as `baseline` on the
offline corpus, save it in the Hugging Face layout, load it back through `tapernorm_jax.hf.gpt2.load_gpt2`, fine-tune
it with every method from that same start, and the plain fine-tune with the scale loss (the tapered variants'
matched control), and write a table shaped like the paper's GPT-2 table to --out: cross-entropy at g = 0 on the
validation split and, with --eval_text, on that text (text the model never saw, as the Pile is for GPT-2), before and
after, mean ± std over seeds. --filter_eval_text also evaluates the text's windows whose every token the training
stream has (the paper's Pile-filtered construction; an error when none is left).
"""

import json
import os
import statistics

from absl import app, flags, logging

from configs import base, gpt2
from tapernorm_jax import cli
from tapernorm_jax.storage.run_files import write_text_atomically
from tapernorm_jax.data import evaluation_sets, text_files
from tapernorm_jax.hf import gpt2 as hf_gpt2
from tapernorm_jax.inference import loading
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.train import loop

ROWS = (
  ("baseline", 0),
  ("baseline", 1),
  ("internal_taper", 1),
  ("all_taper", 1),
  ("fakeln", 1),
  ("fakeln", 0),
)  # (variant, aux)
EVAL_SET = "text"  # --eval_text's name in data.eval_sets; its filtered windows are `text_filtered`
_WORKDIR = flags.DEFINE_string("workdir", "runs/gpt2_demo", "Where the pretraining and fine-tuning runs go.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "Fine-tuning seeds per variant.")
_OUT = flags.DEFINE_string("out", "docs/gpt2_demo.md", "The markdown table.")
_EVAL_TEXT = flags.DEFINE_string("eval_text", "", "Text files (a path or glob) evaluated beside the validation split.")
_FILTER = flags.DEFINE_bool(
  "filter_eval_text",
  False,
  "Also evaluate --eval_text's windows whose every token the training stream has (text_filtered).",
)


def with_eval_text(cfg):
  """`cfg` evaluating --eval_text too (as `text`, and `text_filtered` with --filter_eval_text), when given."""
  if not _EVAL_TEXT.value:
    return cfg
  return base.override(
    cfg,
    {"data.eval_sets": f"{EVAL_SET}={_EVAL_TEXT.value}", "data.filtered_eval_sets": EVAL_SET if _FILTER.value else ""},
  )


def row_name(variant: str, aux: int) -> str:
  """baseline, baseline (+aux), …; FakeLN's aux loss is its own: fakeln, fakeln (no aux)."""
  if variant == "fakeln":
    return variant if aux else f"{variant} (no aux)"
  return f"{variant} (+aux)" if aux else variant


def text_files_named(pattern: str) -> str:
  """The files `pattern` matches, by name, and their size: `sample.txt (3,794 bytes)`."""
  paths = text_files.resolve(pattern, "--eval_text")
  return f"{', '.join(p.name for p in paths)} ({sum(p.stat().st_size for p in paths):,} bytes)"


def cell(values: list[float]) -> str:
  """mean ± std (the std only with two or more values)."""
  return f"{statistics.mean(values):.4f}" + (f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else "")


def results_of(cfg, workdir: str) -> dict:
  """Runs (or resumes, or just reads) one run; a finished run evaluated on other sets than `cfg` asks for is an
  error naming them."""
  path = os.path.join(workdir, "results.json")
  if not os.path.exists(path):
    return loop.run(cfg, workdir)
  with open(path) as f:
    results = json.load(f)
  wanted = {"val", *evaluation_sets.evaluated_names(cfg.data)}
  if wanted != set(results["eval_losses"]):
    raise app.UsageError(
      f"{workdir} was evaluated on {', '.join(sorted(results['eval_losses']))}, not on "
      f"{', '.join(sorted(wanted))}: give the --eval_text and --filter_eval_text it ran with, or a "
      "new --workdir"
    )
  return results


def main(argv: list[str]) -> None:
  """Pretrain, save as Hugging Face GPT-2, fine-tune every variant, tabulate."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _FILTER.value and not _EVAL_TEXT.value:
    raise app.UsageError("--filter_eval_text filters --eval_text's windows; give --eval_text=PATH too")
  if not _SEEDS.value or not all(seed.isdigit() for seed in _SEEDS.value):
    raise app.UsageError(f"--seeds={','.join(_SEEDS.value)}: give comma-separated non-negative integers, e.g. 0,1")
  logging.set_verbosity(logging.WARNING)
  pre_dir, hf_dir = os.path.join(_WORKDIR.value, "pretrain"), os.path.join(_WORKDIR.value, "pretrain", "hf")
  before = results_of(with_eval_text(gpt2.get_config("model=demo,variant=baseline,pretrain=1")), pre_dir)
  if not os.path.exists(os.path.join(hf_dir, hf_gpt2.CONFIG_FILE)):
    loaded = loading.load(pre_dir)
    hf_gpt2.save_gpt2(loaded.variables, loaded.model_cfg, hf_dir)
  sets = ["val", *sorted(set(before["eval_losses"]) - {"val"})]  # then text (and text_filtered) with --eval_text
  rows, per_seed = [["pretrained start", *(f"{before['eval_losses'][n]:.4f}" for n in sets), "—"]], {}
  for variant, aux in ROWS:
    runs = []
    for seed in _SEEDS.value:
      cfg = base.override(gpt2.get_config(f"model=demo,variant={variant},aux={aux},seed={seed}"), {"init_from": hf_dir})
      runs.append(results_of(with_eval_text(cfg), os.path.join(_WORKDIR.value, f"{variant}-aux{aux}-seed{seed}")))
    per_seed[row_name(variant, aux)] = [r["final_val_loss"] for r in runs]
    rows.append([row_name(variant, aux), *(cell([r["eval_losses"][n] for r in runs]) for n in sets), len(runs)])
  cfg = gpt2.get_config("model=demo")
  where = ""
  if _EVAL_TEXT.value:
    where = f"; `{EVAL_SET}` is {text_files_named(_EVAL_TEXT.value)}, text it never trained on"
    if _FILTER.value:
      where += f", and `{EVAL_SET}_filtered` its windows whose every token occurs in the training stream"
  table = "\n".join(
    [
      f"Cross-entropy (nats/token, g = 0) of the demo model ({before['params']:,} parameters, {before['corpus']}), "
      f"pretrained {before['steps']} steps as baseline, then fine-tuned {cfg.train.steps} steps of "
      f"{cfg.train.batch_size} × {cfg.model.T} tokens from the same start; mean ± std over seeds "
      f"{', '.join(_SEEDS.value)}. `val` is the corpus's validation split{where}.",
      "",
      markdown_table(["variant", *sets, "seeds"], rows),
      "",
      "Per seed (val): " + "; ".join(f"{m} " + ", ".join(f"{x:.4f}" for x in v) for m, v in per_seed.items()) + ".",
    ]
  )
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  write_text_atomically(_OUT.value, table + "\n")
  print(table)


if __name__ == "__main__":
  cli.run(main)
