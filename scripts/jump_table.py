"""PRepBN's hand-over jump per run of a study (configs/sweeps/prepbn_checks.py): the training loss when λ is 0.2
(a fifth of the blend left), its peak from there to 20 steps past the blend's end, the rise between them, and the
final validation loss; one row per setting, mean ± std over seeds.

    .venv/bin/python scripts/jump_table.py runs/prepbn-checks > docs/methods/prepbn_jump/README-table.md

A development tool (the package never imports it); docs/studies.md reads its output.
"""

import collections
import statistics
import sys

from tapernorm_jax.studies.analysis.run_rows import read_metrics, read_runs


def jump(run) -> tuple[float, float, int]:
  """(loss at λ = 0.2, peak loss to 20 steps after the blend ends, the peak's step) of one PRepBN run."""
  records = [r for r in read_metrics(run.path, max_points=10**6) if "loss" in r]
  end = next(r["step"] for r in records if r["gate"] == 0.0)
  before = next(r for r in records if r["gate"] <= 0.2)
  window = [r for r in records if before["step"] <= r["step"] <= end + 20]
  peak = max(window, key=lambda r: r["loss"])
  return before["loss"], peak["loss"], peak["step"]


def main(workdir: str) -> None:
  rows = collections.defaultdict(list)
  for run in read_runs(workdir):
    if run.status == "complete":
      rows[run.cell.split("seed")[1][1:].lstrip("-") or "as in the study"].append((*jump(run), run.final_val_loss))
  fmt = lambda xs: f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"
  print("| setting | seeds | loss at λ = 0.2 | peak loss (step) | rise | final validation loss |")
  print("|---|---|---|---|---|---|")
  for tag, values in sorted(rows.items()):
    at, peak, step, final = zip(*values)
    rise = [p - a for a, p in zip(at, peak)]
    steps = ", ".join(str(s) for s in step)
    print(f"| {tag} | {len(values)} | {fmt(at)} | {fmt(peak)} ({steps}) | {fmt(rise)} | {fmt(final)} |")


if __name__ == "__main__":
  main(sys.argv[1])
