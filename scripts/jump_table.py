"""PRepBN's hand-over jump per run of a study (configs/sweeps/prepbn_checks.py): the training loss when λ is 0.2
(a fifth of the blend left), its peak from there to 20 steps past the blend's end, the rise between them, and the
final validation loss; one row per setting, mean ± std over seeds; with a second argument, a figure of the training
loss through the blend.

    .venv/bin/python scripts/jump_table.py runs/prepbn-checks docs/methods/prepbn_jump/training_loss.png

A development tool (the package never imports it); docs/studies.md reads its output.
"""

import collections
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from intervention_table import described, order, setting  # noqa: E402
from tapernorm_jax.studies.analysis.run_rows import read_metrics, read_runs  # noqa: E402


def jump(run) -> tuple[float, float, int]:
  """(loss at λ = 0.2, peak loss to 20 steps after the blend ends, the peak's step) of one PRepBN run."""
  records = [r for r in read_metrics(run.path, max_points=10**6) if "loss" in r]
  end = next(r["step"] for r in records if r["gate"] == 0.0)
  before = next(r for r in records if r["gate"] <= 0.2)
  window = [r for r in records if before["step"] <= r["step"] <= end + 20]
  peak = max(window, key=lambda r: r["loss"])
  return before["loss"], peak["loss"], peak["step"]


def figure(runs, path: str) -> None:
  """Training loss against step, one line per setting (mean over seeds), with the blend's λ on a second axis."""
  fig, ax = plt.subplots(figsize=(8, 5.5))
  by_setting = collections.defaultdict(list)
  for run in runs:
    by_setting[setting(run)].append([r for r in read_metrics(run.path, max_points=10**6) if "loss" in r])
  for name, histories in sorted(by_setting.items(), key=lambda kv: order(kv[0])):
    steps = [r["step"] for r in histories[0]]
    loss = np.mean([[r["loss"] for r in h] for h in histories], axis=0)
    ax.plot(steps, loss, label=f"{described(name)} ({len(histories)} seeds' mean)")
  gate = ax.twinx()
  gate.plot(steps, [r["gate"] for r in histories[0]], "k:", label="λ (the norm's share)")
  gate.set_ylabel("λ, the norm's share of the blend (dotted)")
  ax.set(xlabel="training step", ylabel="training loss (nats per token)", ylim=(0, 6))
  ax.set_title(
    "PRepBN at cpu_l: training loss through the blend's end\n(as in the study: γ0 = 3, BatchNorm's weight from 0)"
  )
  lines = ax.get_legend_handles_labels()
  extra = gate.get_legend_handles_labels()
  ax.legend(lines[0] + extra[0], lines[1] + extra[1], loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(workdir: str, figure_path: str | None = None) -> None:
  rows = collections.defaultdict(list)
  runs = [run for run in read_runs(workdir) if run.status == "complete"]
  if figure_path:
    figure(runs, figure_path)
  for run in runs:
    rows[setting(run)].append((*jump(run), run.final_val_loss))
  fmt = lambda xs: f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"
  print("| setting | seeds | loss at λ = 0.2 | peak loss (step) | rise | final validation loss |")
  print("|---|---|---|---|---|---|")
  for tag, values in sorted(rows.items(), key=lambda kv: order(kv[0])):
    at, peak, step, final = zip(*values)
    rise = [p - a for a, p in zip(at, peak)]
    steps = ", ".join(str(s) for s in step)
    print(f"| {described(tag)} | {len(values)} | {fmt(at)} | {fmt(peak)} ({steps}) | {fmt(rise)} | {fmt(final)} |")


if __name__ == "__main__":
  main(*sys.argv[1:3])
