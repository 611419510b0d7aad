"""A tuning study's report: each method's settings (the grids' tags) at each size, scored on the `tune` split (the
train stream's held-out tail, `data.tune_frac`), never on the validation split the other studies report; the best
setting per method and size is chosen, and tuning.md, tuning.json, results.csv and figures/tuning_grid.png say what
each setting scored and which was chosen."""

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
from matplotlib.patches import Rectangle
import numpy as np

from tapernorm_jax.storage.run_files import write_text_atomically
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.studies import manifest
from tapernorm_jax.studies.analysis.plotting import new_figure, save_png
from tapernorm_jax.studies.analysis.run_rows import (
  FINISHED,
  Key,
  Run,
  csv_text,
  label,
  read_run,
  size_order,
  variant_order,
)

FIGURE = "tuning_grid.png"
UNENDED = ("pending", "incomplete", "missing")  # run states that say nothing yet of a setting
Group = tuple[str, int, str]  # (variant, aux, size)
SHARED_KEYS = ("data.tune_frac", "train.eval_batches")  # the study's own settings, the same for every trial


@dataclasses.dataclass
class Trial:
  """One setting of one method at one size: its runs over the seeds and their losses on the tune split."""

  variant: str
  aux: int
  size: str
  tag: str
  overrides: Mapping[str, Any]
  runs: list[Run]
  tune_losses: list[float]  # one per run that finished with a finite tune loss and learned context

  @property
  def key(self) -> Key:
    """(variant, aux)."""
    return self.variant, self.aux

  @property
  def complete(self) -> bool:
    """Every seed finished, none failed, diverged or learned no context: only such a setting can be chosen."""
    return bool(self.runs) and len(self.tune_losses) == len(self.runs)

  @property
  def mean(self) -> float | None:
    """Mean tune loss over the seeds (None unless `complete`)."""
    return float(np.mean(self.tune_losses)) if self.complete else None

  @property
  def lr(self) -> float | None:
    """The trial's learning rate (`opt.lr`), where it set one."""
    value = self.overrides.get("opt.lr")
    return float(value) if value is not None else None

  @property
  def knob(self) -> str:
    """The tag without its learning-rate part: `lr3e-3_gain5` → `gain5` (the method's own setting)."""
    head, _, rest = self.tag.partition("_")
    return rest if head.startswith("lr") and rest else self.tag


def knob_order(knob: str) -> tuple:
  """A knob's place among its method's: by the numbers in it (gain3 before gain10, blend36-299 after blend20-210)."""
  return tuple(float(n) for n in re.findall(r"\d+(?:\.\d+)?", knob)), knob


def is_tuning_study(workdir: str) -> bool:
  """Whether the study's manifest has tagged cells (a tuning study: settings per method, not one run per method)."""
  return any(c.tag for c in manifest.manifest_cells(workdir).values())


def tune_loss(run: Run) -> float | None:
  """The run's final loss on the tune split (results.json `eval_losses.tune`), if it finished and learned context."""
  if run.status != "complete":
    return None
  results = manifest.read_results(run.path) or {}
  value = (results.get("eval_losses") or {}).get("tune")
  return float(value) if value is not None and math.isfinite(value) else None


def read_trials(workdir: str) -> list[Trial]:
  """The study's trials: its manifest's cells grouped by variant, aux, size and tag, the seeds' runs read."""
  trials: dict[tuple[str, int, str, str], Trial] = {}
  for name, cell in manifest.manifest_cells(workdir).items():
    path = os.path.join(workdir, name)
    run = (
      read_run(path, cell.to_json())
      if os.path.isdir(path)
      else Run(cell=name, variant=cell.variant, aux=cell.aux, size=cell.point, seed=cell.seed, status="missing")
    )
    trial = trials.setdefault(
      (cell.variant, cell.aux, cell.point, cell.tag),
      Trial(cell.variant, cell.aux, cell.point, cell.tag, dict(cell.overrides), [], []),
    )
    trial.runs.append(run)
    if (loss := tune_loss(run)) is not None:
      trial.tune_losses.append(loss)
  return sorted(
    trials.values(), key=lambda t: (variant_order(t.key), size_order(t.size), t.size, t.knob, t.lr or 0.0, t.tag)
  )


def chosen(trials: Sequence[Trial]) -> dict[Group, Trial]:
  """The trial with the least mean tune loss for each method and size, among those whose every seed trained."""
  best: dict[Group, Trial] = {}
  for t in trials:
    group = (t.variant, t.aux, t.size)
    if t.complete and (group not in best or t.mean < best[group].mean):
      best[group] = t
  return best


def groups_of(trials: Sequence[Trial]) -> list[Group]:
  """Every (variant, aux, size) of the study, in report order."""
  seen = dict.fromkeys((t.variant, t.aux, t.size) for t in trials)
  return list(seen)


def tuning_json(trials: Sequence[Trial]) -> dict[str, Any]:
  """tuning.json: per method and size, the chosen setting's tag, overrides and mean tune loss (None: none trained)."""
  best = chosen(trials)
  out: dict[str, Any] = {}
  for variant, aux, size in groups_of(trials):
    t = best.get((variant, aux, size))
    out.setdefault(f"{variant}:aux={aux}", {})[size] = (
      None if t is None else {"tag": t.tag, "overrides": dict(t.overrides), "tune_loss": t.mean, "seeds": len(t.runs)}
    )
  return out


def loss_cell(t: Trial, best: Trial | None) -> str:
  """`2.143`, bold where chosen; the runs' state where it has no mean."""
  if t.mean is not None:
    return f"**{t.mean:.3f}**" if t is best else f"{t.mean:.3f}"
  states = sorted(
    {r.status for r in t.runs if r.status not in FINISHED}
    | ({"no context"} if any(r.status == "no_context" for r in t.runs) else set())
  )
  return " / ".join(states) or "no tune loss"


def grid_markdown(trials: Sequence[Trial]) -> str:
  """One table per method: a row per setting (knob × learning rate), a column per size, the chosen bold."""
  best = chosen(trials)
  sizes = sorted({t.size for t in trials}, key=lambda s: (size_order(s), s))
  parts = []
  for key in sorted({t.key for t in trials}, key=variant_order):
    rows = {}
    for t in (t for t in trials if t.key == key):
      rows.setdefault((t.knob, t.lr or 0.0), {})[t.size] = loss_cell(t, best.get((t.variant, t.aux, t.size)))
    table = [
      [knob, f"{lr:g}" if lr else "", *(cells.get(s, "") for s in sizes)]
      for (knob, lr), cells in sorted(rows.items(), key=lambda item: (knob_order(item[0][0]), item[0][1]))
    ]
    parts.append(f"### {label(*key)}\n\n" + markdown_table(["setting", "opt.lr", *sizes], table))
  return "\n\n".join(parts)


def chosen_markdown(trials: Sequence[Trial]) -> str:
  """The chosen setting per method and size, with its overrides."""
  best = chosen(trials)
  rows = []
  for variant, aux, size in groups_of(trials):
    t = best.get((variant, aux, size))
    ended = any(
      r.status not in UNENDED
      for trial in trials
      if (trial.variant, trial.aux, trial.size) == (variant, aux, size)
      for r in trial.runs
    )
    none = "none (no setting trained on every seed)" if ended else "none yet (its runs have not trained)"
    rows.append(
      [
        label(variant, aux),
        size,
        none if t is None else t.tag,
        "" if t is None else f"{t.mean:.3f}",
        "" if t is None else ", ".join(f"`{k}={v}`" for k, v in sorted(t.overrides.items()) if k not in SHARED_KEYS),
      ]
    )
  return markdown_table(["method", "size", "chosen", "tune loss", "overrides"], rows)


def figure_grid(trials: Sequence[Trial]) -> Any:
  """A heat map per method and size: mean tune loss over the knob × learning rate, the chosen setting ringed."""
  keys = sorted({t.key for t in trials}, key=variant_order)
  sizes = sorted({t.size for t in trials}, key=lambda s: (size_order(s), s))
  best = chosen(trials)
  fig = new_figure(max(3.2 * len(sizes) + 1.5, 7.0), 2.6 * len(keys) + 1.0)
  fig.set_layout_engine("constrained")  # the titles and the colour bar clear of the panels
  cmap = matplotlib.colormaps["viridis_r"].with_extremes(bad="#dddddd")
  axes = fig.subplots(len(keys), len(sizes), squeeze=False)
  finite = [t.mean for t in trials if t.mean is not None]
  lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
  image = None
  for i, key in enumerate(keys):
    for j, size in enumerate(sizes):
      ax = axes[i][j]
      here = [t for t in trials if t.key == key and t.size == size]
      knobs = sorted({t.knob for t in here}, key=knob_order)
      lrs = sorted({t.lr or 0.0 for t in here})
      grid_KxR = np.full((len(knobs), len(lrs)), np.nan)
      ran_KxR = np.zeros_like(grid_KxR, bool)  # the settings in the grid (the rest: a blank grey cell)
      for t in here:
        grid_KxR[knobs.index(t.knob), lrs.index(t.lr or 0.0)] = np.nan if t.mean is None else t.mean
        ran_KxR[knobs.index(t.knob), lrs.index(t.lr or 0.0)] = True
      image = ax.imshow(grid_KxR, cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
      for (k, r), value in np.ndenumerate(grid_KxR):
        ax.text(
          r,
          k,
          "" if not ran_KxR[k, r] else "×" if np.isnan(value) else f"{value:.2f}",
          ha="center",
          va="center",
          fontsize=7,
          color="white" if value > (lo + hi) / 2 else "black",
        )  # NaN compares False: black on grey
      if (t := best.get((*key, size))) is not None:
        ax.add_patch(_ring(lrs.index(t.lr or 0.0), knobs.index(t.knob)))
      ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs], fontsize=7)
      ax.set_yticks(range(len(knobs)), knobs, fontsize=7)
      ax.set_title(f"{label(*key)} · {size}", fontsize=8)
      if i == len(keys) - 1:
        ax.set_xlabel("learning rate (opt.lr)", fontsize=8)
      if j == 0:
        ax.set_ylabel("the method's setting", fontsize=8)
  fig.suptitle(
    "Tuning: mean loss on the tune split\n"
    "(× a seed failed or learned no context; grey without ×: not in the grid; red: chosen)",
    fontsize=10,
  )
  if image is not None:
    fig.colorbar(image, ax=axes, shrink=0.6, label="tune loss (nats/token)")
  return fig


def _ring(x: float, y: float) -> Any:
  """A red square around the chosen cell of a heat map."""
  return Rectangle((x - 0.48, y - 0.48), 0.96, 0.96, fill=False, edgecolor="red", linewidth=2)


def write_tuning_report(workdir: str, out: str, generated: str) -> dict[str, Any]:
  """Writes tuning.md (the grid per method, the chosen settings), tuning.json, results.csv and the figure to `out`."""
  trials = read_trials(workdir)
  runs = [r for t in trials for r in t.runs]
  os.makedirs(os.path.join(out, "figures"), exist_ok=True)
  save_png(figure_grid(trials), os.path.join(out, "figures", FIGURE))
  write_text_atomically(os.path.join(out, "tuning.json"), json.dumps(tuning_json(trials), indent=2) + "\n")
  write_text_atomically(os.path.join(out, "results.csv"), csv_text(runs))
  shared = {k: v for k, v in trials[0].overrides.items() if k in SHARED_KEYS} if trials else {}
  finished = sum(r.status in FINISHED for r in runs)
  text = "\n\n".join(
    [
      f"# Tuning study `{os.path.basename(workdir)}`",
      f"{generated}. {finished} of {len(runs)} runs finished; {len(trials)} settings over "
      f"{len({(t.variant, t.aux, t.size) for t in trials})} method × size pairs.",
      "Each setting is scored by its mean loss on the **tune split** (nats/token): the last "
      f"{float(shared.get('data.tune_frac', 0)):.0%} of the training stream, whole documents, which these runs never "
      "train on. The validation split the other studies report is not used to choose. A setting is chosen only if "
      "every seed trained (no failure, no divergence, no run at the unigram reference).",
      "## Chosen settings",
      chosen_markdown(trials),
      "## Every setting (bold: chosen)",
      grid_markdown(trials),
      f"![tuning grid](figures/{FIGURE})",
    ]
  )
  write_text_atomically(os.path.join(out, "tuning.md"), text + "\n")
  return {
    "report": os.path.join(out, "tuning.md"),
    "csv": os.path.join(out, "results.csv"),
    "figures": [os.path.join(out, "figures", FIGURE)],
    "runs": len(runs),
    "complete": finished,
    "no_context": sum(r.status == "no_context" for r in runs),
  }
