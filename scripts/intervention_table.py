"""A study's interventions (tagged cells: configs/sweeps/budget_checks.py, ladder_checks.py) beside the runs they
change: per method, size and setting, the final validation loss (mean ± std over seeds), the logit norm's growth from
the taper start to the end, and the pre-logit rms s(h) over the last 10% of steps against the scale loss's target
(the plain baseline has none: its s(h) is what the final norm sees).
The study's rows shown are the checked methods' and the plain baseline's at the checked sizes, and any
`variant:aux` named after the two directories.

    .venv/bin/python scripts/intervention_table.py runs/budget-checks runs/budgets-tpp5 > docs/budgets/tpp5/checks.md
    .venv/bin/python scripts/intervention_table.py runs/ladder-checks runs/ladder all_taper:1 internal_taper:1

A development tool (the package never imports it); docs/studies.md reads its output.
"""

import collections
import statistics
import sys

import numpy as np

from tapernorm_jax.studies.analysis.curves import series, taper_start
from tapernorm_jax.studies.analysis.run_rows import Run, label, read_metrics, read_runs, size_order

SETTINGS = {
  "": "as in the study",
  "lambda1": "λ = 1",
  "gain1": "γ0 = 1",
  "gain3": "γ0 = 3",
  "gain10": "γ0 = 10",
  "wd0.1": "weight decay 0.1",
  "mean": "scale loss on the batch's mean s(h)",
  "bn3": "BatchNorm's weight from 3",
  "cal3000": "calibration at step 3,000",
  "kernels": "through the kernels CPU path",
  "xla": "through the xla CPU path",
}


def order(tag: str) -> tuple[int, str]:
  """Sorts the study's own cells first, then the known settings in SETTINGS' order, then the rest by name."""
  return (list(SETTINGS).index(tag), "") if tag in SETTINGS else (len(SETTINGS), tag)


def described(tag: str) -> str:
  """What a tag sets, in words (`final5.3`: the final norm's γ0)."""
  return f"final norm's γ0 = {tag[len('final') :]}" if tag.startswith("final") else SETTINGS.get(tag, tag)


def setting(run: Run) -> str:
  """The cell's tag (`lambda1`), "" for the study's own cells."""
  return run.cell.split(f"-seed{run.seed}")[-1].lstrip("-")


def dynamics(run: Run) -> tuple[float, float, float]:
  """(logit norm growth from the taper start to the end, mean s(h) and mean s_tgt over the last 10% of steps)."""
  records = read_metrics(run.path)
  steps, norms = series(records, "logit_norm")
  start = taper_start(run.config)
  growth = float(norms[-1] / np.interp(start, steps, norms)) if len(steps) and start is not None else float("nan")
  tail = [r for r in records if r["step"] >= 0.9 * run.steps and "s_mean" in r]
  s = statistics.fmean(r["s_mean"] for r in tail) if tail else float("nan")
  target = statistics.fmean(r["s_tgt"] for r in tail if "s_tgt" in r) if tail else float("nan")
  return growth, s, target


def rows(runs: list[Run], wanted: set[tuple[str, int, str]]) -> list[list[str]]:
  """One row per (size, method, setting) whose (variant, aux, size) is `wanted`."""
  groups: dict[tuple[str, str, int, str], list[Run]] = collections.defaultdict(list)
  for run in runs:
    if run.status == "complete" and (run.variant, run.aux, run.size) in wanted:
      groups[(run.size, run.variant, run.aux, setting(run))].append(run)
  out = []
  for (size, variant, aux, tag), group in sorted(
    groups.items(), key=lambda kv: (size_order(kv[0][0]), kv[0][1:3], order(kv[0][3]))
  ):
    losses = [r.final_val_loss for r in group]
    growth, s, target = np.nanmean([dynamics(r) for r in group], axis=0)
    spread = statistics.stdev(losses) if len(losses) > 1 else 0.0
    out.append(
      [
        size,
        label(variant, aux),
        described(tag),
        str(len(group)),
        f"{statistics.fmean(losses):.3f} ± {spread:.3f}",
        f"{growth:.2f}×",
        f"{s:.3f}",
        f"{target:.3f}" if target == target and (variant != "baseline" or aux) else "— (no scale loss)",
      ]
    )
  return out


def main(checks_dir: str, reference_dir: str, *shown: str) -> None:
  """Prints the markdown table; `shown`: more of the study's methods as `variant:aux`."""
  checks = read_runs(checks_dir)
  methods = {("baseline", 0), *((v, int(a)) for v, a in (m.split(":") for m in shown))}
  wanted = {(r.variant, r.aux, r.size) for r in checks} | {(v, a, r.size) for v, a in methods for r in checks}
  table = rows(checks + read_runs(reference_dir), wanted)
  header = ["size", "method", "setting", "seeds", "val loss", "logit growth", "s(h), last 10%", "s target"]
  print("| " + " | ".join(header) + " |")
  print("|" + "---|" * len(header))
  for row in table:
    print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
  main(*sys.argv[1:])
