"""Study reports: run directories → one row per run, Table 2 aggregates over seeds, results.csv, the figures."""

import csv
import dataclasses
import io
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter
import numpy as np
from PIL import Image

from tapernorm_jax import config_fields, files, hardware
from tapernorm_jax.files import write_text_atomically
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.studies import manifest
from tapernorm_jax.taper.variants import SIZES, VARIANTS

# Kanavalau, Amo Alonso and Lall, "Gated Normalization Removal and Scale Anchoring in Pre-Norm Transformers"
# (arXiv 2602.10408), Table 2: TinyStories validation loss (nats/token) at g = 0, mean ± std over 6 seeds.
# Keys: (size, variant, aux). The setup is docs/method.md §8.
PAPER_TABLE2 = {
    ("1m", "baseline", 0): (2.1538, 0.0025), ("1m", "internal_taper", 1): (2.1852, 0.0040),
    ("1m", "all_taper", 1): (2.1930, 0.0035),
    ("3m", "baseline", 0): (1.7561, 0.0010), ("3m", "internal_taper", 1): (1.7828, 0.0029),
    ("3m", "all_taper", 1): (1.7874, 0.0028),
    ("9m", "baseline", 0): (1.4620, 0.0022), ("9m", "internal_taper", 1): (1.4837, 0.0016),
    ("9m", "all_taper", 1): (1.4837, 0.0023),
    ("30m", "baseline", 0): (1.2768, 0.0018), ("30m", "internal_taper", 1): (1.2859, 0.0010),
    ("30m", "all_taper", 1): (1.2868, 0.0041),
}
CSV_COLUMNS = ("cell", "variant", "aux", "size", "seed", "params", "steps", "tokens", "final_val_loss",
               "wall_time_s", "tokens_per_s", "mfu", "status", "error", "corpus", "device")
WEIGHT_TYPES = (("qkv", "QKV"), ("attn_out", "attention out"), ("mlp_in", "MLP in"), ("mlp_out", "MLP out"))
VARIANT_ORDER = (("baseline", 0), ("internal_taper", 1), ("all_taper", 1), ("final_taper", 1),
                 ("internal_taper", 0), ("all_taper", 0), ("final_taper", 0), ("baseline", 1))
COLORS = {("baseline", 0): "#222222", ("internal_taper", 1): "#1f77b4", ("all_taper", 1): "#2ca02c",
          ("final_taper", 1): "#9467bd", ("internal_taper", 0): "#17becf", ("all_taper", 0): "#d62728",
          ("final_taper", 0): "#ff7f0e", ("baseline", 1): "#7f7f7f"}
DPI = 110
Key = tuple[str, int]  # (variant, aux)


def label(variant: str, aux: int) -> str:
  """`internal_taper (+aux)`, `all_taper (aux=0)`, `final_taper`: the aux setting where it matters."""
  if aux:
    return f"{variant} (+aux)"
  return f"{variant} (aux=0)" if VARIANTS.get(variant, ("", "", True))[2] else variant


def unanchored(variant: str, aux: int) -> bool:
  """The final norm is tapered and no scale loss replaces it (the paper's unanchored ablations)."""
  return VARIANTS.get(variant, ("", ""))[1] == "taper" and not aux


def size_order(size: str) -> int:
  """SIZES order (1m, 3m, 9m, 30m, cpu); unknown sizes last."""
  return list(SIZES).index(size) if size in SIZES else len(SIZES)


def variant_order(key: Key) -> int:
  """Baseline first, anchored variants, then unanchored ones."""
  return VARIANT_ORDER.index(key) if key in VARIANT_ORDER else len(VARIANT_ORDER)


# ------------------------------------------------------------------------------------------------ run rows


@dataclasses.dataclass
class Run:
  """One cell of a study: what it is, where it stands and, when complete, its results."""

  cell: str
  variant: str
  aux: int
  size: str
  seed: int
  status: str  # complete | failed | incomplete | pending (never started) | missing (in the grid, no directory)
  path: str = ""
  error: str = ""
  params: int | None = None
  steps: int | None = None
  tokens: int | None = None
  final_val_loss: float | None = None
  wall_time_s: float | None = None
  tokens_per_s: float | None = None
  mfu: float | None = None
  corpus: str = ""
  device: str = ""
  config: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def key(self) -> Key:
    """(variant, aux)."""
    return self.variant, self.aux

  def csv_row(self) -> dict[str, Any]:
    """The results.csv columns."""
    return {c: ("" if getattr(self, c) is None else getattr(self, c)) for c in CSV_COLUMNS}


def _read_json(path: str) -> dict[str, Any]:
  """A JSON file, or {} when absent."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def read_metrics(run_dir: str, max_points: int = 2000) -> list[dict[str, Any]]:
  """`metrics.jsonl`, thinned to about `max_points` step records (every diagnostics record and the last kept).

  Streams the file, parsing only the lines it keeps, so million-step runs read in seconds.
  """
  path = os.path.join(run_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    head = f.read(65536)
    lines_estimate = os.path.getsize(path) / max(len(head) / max(head.count("\n"), 1), 1)
    every = max(1, int(lines_estimate // max_points))
    f.seek(0)
    records, last, kept_last = [], "", True
    for i, line in enumerate(f):
      if not line.strip():
        continue
      last, kept_last = line, i % every == 0 or '"logit_norm"' in line
      if kept_last:
        records.append(json.loads(line))
  if not kept_last:
    records.append(json.loads(last))
  return records


def flops_per_token(config: Mapping[str, Any], params: int) -> float | None:
  """Training FLOPs per token, 6·N + 12·L·D·T (PaLM's estimate with attention), from a run's config.json."""
  model = config.get("model", {})
  if not all(k in model for k in ("L", "D", "T")):
    return None
  return hardware.train_flops_per_token(params, model["L"], model["D"], model["T"])


def steady_tokens_per_s(records: Sequence[Mapping[str, Any]]) -> float | None:
  """The median of the logged training throughput (robust to the first, compiling interval)."""
  values = [r["tokens_per_s"] for r in records if isinstance(r.get("tokens_per_s"), (int, float))]
  return float(np.median(values)) if values else None


def read_run(run_dir: str, expected: Mapping[str, Any] | None = None) -> Run:
  """One run directory as a Run: identity from results.json, config.json, cell.json or the manifest entry."""
  name = os.path.basename(os.path.normpath(run_dir))
  status = manifest.cell_status(run_dir)
  results = dict(status.results or {})
  config = config_fields.upgrade(_read_json(os.path.join(run_dir, "config.json")))
  record = manifest.read_record(run_dir)
  ident = {**(expected or {}), **record}
  if config:
    ident.update(variant=config.get("variant", ident.get("variant")), size=config.get("size", ident.get("size")),
                 seed=config.get("seed", ident.get("seed")),
                 aux=int(config.get("taper", {}).get("aux_weight", 0) > 0))
  if results:
    ident.update(variant=config_fields.current_value("variant", results["variant"]), size=results["size"],
                 seed=results["seed"],
                 aux=int(results.get("aux_weight", 0) > 0))
  if not all(k in ident for k in ("variant", "size", "seed", "aux")):
    raise ValueError(f"{run_dir}: neither results.json, config.json nor cell.json says which run this is; "
                     "move it out of the study directory")
  run = Run(cell=name, variant=ident["variant"], aux=int(ident["aux"]), size=ident["size"], seed=int(ident["seed"]),
            status=status.state, path=run_dir, error=status.error, config=config)
  if status.state == "incomplete":
    where = f"at step {status.step} of {config.get('train', {}).get('steps', '?')}"
    run.error = f"running, or interrupted {where}" if record.get("status") == "running" else f"stopped {where}"
  if results:
    run.params, run.steps, run.tokens = results.get("params"), results.get("steps"), results.get("tokens")
    loss = results.get("final_val_loss")
    run.final_val_loss = float(loss) if loss is not None else None
    if run.final_val_loss is not None and not math.isfinite(run.final_val_loss):
      run.status, run.error = "failed", f"final validation loss is {run.final_val_loss}"
    run.wall_time_s, run.corpus = results.get("wall_time_s"), results.get("corpus", "")
    run.tokens_per_s = steady_tokens_per_s(read_metrics(run_dir)) or (
        run.tokens / run.wall_time_s if run.tokens and run.wall_time_s else None)
    kind = results.get("device_kind") or record.get("device_kind", "")
    count = int(results.get("devices") or record.get("device_count") or 1)
    run.device = f"{kind} × {count}" if kind else f"{results.get('backend', '?')} × {count}"
    fpt = flops_per_token(config, run.params) if run.params else None
    if kind and fpt and run.tokens_per_s:
      run.mfu = hardware.mfu(run.tokens_per_s, fpt, kind, count)
  return run


def is_run_dir(path: str) -> bool:
  """A directory that holds (or held) a run: results.json, config.json, metrics.jsonl or a sweep cell record."""
  return os.path.isdir(path) and any(os.path.exists(os.path.join(path, f)) for f in
                                     ("results.json", "config.json", "metrics.jsonl", manifest.CELL_RECORD))


def read_runs(workdir: str) -> list[Run]:
  """Every run under `workdir`, plus a `missing` row for each cell of the sweep manifest without a directory."""
  listed = manifest.read_manifest(workdir) or {"cells": []}
  expected = {c["name"]: c for c in listed["cells"]}
  runs = [read_run(os.path.join(workdir, name), expected.get(name)) for name in sorted(os.listdir(workdir))
          if is_run_dir(os.path.join(workdir, name))]
  present = {r.cell for r in runs}
  runs += [Run(cell=name, variant=c["variant"], aux=int(c["aux"]), size=c["size"], seed=int(c["seed"]),
               status="missing") for name, c in expected.items() if name not in present]
  return sorted(runs, key=lambda r: (size_order(r.size), r.size, variant_order(r.key), r.variant, r.aux, r.seed))


def csv_text(runs: Sequence[Run]) -> str:
  """results.csv: one row per run, CSV_COLUMNS."""
  out = io.StringIO()
  writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
  writer.writeheader()
  for run in runs:
    writer.writerow(run.csv_row())
  return out.getvalue()


# -------------------------------------------------------------------------------------------- aggregation


@dataclasses.dataclass
class Group:
  """The seeds of one size × variant: val loss mean ± sample std (ddof = 1) over the complete ones."""

  size: str
  variant: str
  aux: int
  losses: list[float]
  expected: int  # runs of this group in the study (complete or not)
  params: int | None = None
  gap_pct: float | None = None  # relative to the baseline at the same size, in %

  @property
  def n(self) -> int:
    """Seeds that count (complete, finite loss)."""
    return len(self.losses)

  @property
  def mean(self) -> float | None:
    """Mean final val loss."""
    return float(np.mean(self.losses)) if self.losses else None

  @property
  def std(self) -> float | None:
    """Sample standard deviation (None below 2 seeds)."""
    return float(np.std(self.losses, ddof=1)) if self.n >= 2 else None


def aggregate(runs: Sequence[Run]) -> list[Group]:
  """One Group per size × (variant, aux), ordered by size then variant; gaps against the baseline."""
  groups: dict[tuple[str, str, int], Group] = {}
  for run in runs:
    g = groups.setdefault((run.size, run.variant, run.aux), Group(run.size, run.variant, run.aux, [], 0))
    g.expected += 1
    if run.status == "complete" and run.final_val_loss is not None:
      g.losses.append(run.final_val_loss)
      g.params = run.params if g.params is None else g.params
  for g in groups.values():
    ref = groups.get((g.size, "baseline", 0))
    if ref is not None and ref.mean is not None and g.mean is not None and (g.variant, g.aux) != ("baseline", 0):
      g.gap_pct = 100.0 * (g.mean - ref.mean) / ref.mean
  return sorted(groups.values(), key=lambda g: (size_order(g.size), g.size, variant_order((g.variant, g.aux))))


def paper_setting(runs: Sequence[Run]) -> bool:
  """True when the complete runs are the paper's setting: TinyStories, the paper's sizes and step counts."""
  done = [r for r in runs if r.status == "complete"]
  return bool(done) and all(r.corpus == "tinystories" and r.size in ("1m", "3m", "9m", "30m")
                            and r.steps == SIZES[r.size]["steps"] for r in done)


def loss_text(mean: float, std: float | None, gap: float | None) -> str:
  """`2.1852 ± 0.0040 (+1.46%)`."""
  text = f"{mean:.4f}" + (f" ± {std:.4f}" if std is not None else "")
  return text + (f" ({gap:+.2f}%)" if gap is not None else "")


def params_text(params: int | None) -> str:
  """`226.8K`, `30.29M`."""
  if params is None:
    return "?"
  return f"{params / 1e6:.2f}M" if params >= 1e6 else f"{params / 1e3:.1f}K"


def table2_markdown(groups: Sequence[Group], with_paper: bool = False) -> str:
  """Table 2: a row per size, a column per variant; `mean ± std (gap to baseline) · n seeds` (and the paper's)."""
  keys = sorted({(g.variant, g.aux) for g in groups}, key=variant_order)
  sizes = sorted({g.size for g in groups}, key=size_order)
  by = {(g.size, g.variant, g.aux): g for g in groups}
  rows = []
  for size in sizes:
    params = next((g.params for g in groups if g.size == size and g.params), None)
    row: list[str] = [size, params_text(params)]
    for variant, aux in keys:
      g = by.get((size, variant, aux))
      if g is None:
        row.append("—")
        continue
      seeds = f"n = {g.n}" + (f" of {g.expected}" if g.expected != g.n else "")
      text = (loss_text(g.mean, g.std, g.gap_pct) if g.n else "no complete run") + f" · {seeds}"
      paper = PAPER_TABLE2.get((size, variant, aux))
      if with_paper and paper:
        ref = PAPER_TABLE2.get((size, "baseline", 0))
        gap = None if (variant, aux) == ("baseline", 0) else 100 * (paper[0] - ref[0]) / ref[0]
        text += f"<br>paper: {loss_text(paper[0], paper[1], gap)}"
      row.append(text)
    rows.append(row)
  return markdown_table(["size", "params", *(label(*k) for k in keys)], rows)


# ------------------------------------------------------------------------------------------------- curves


def series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of the records that hold a finite number under `key`."""
  pairs = [(r["step"], r[key]) for r in records
           if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
  if not pairs:
    return np.zeros(0), np.zeros(0)
  steps, values = zip(*pairs)
  return np.asarray(steps, float), np.asarray(values, float)


def smooth(values: np.ndarray, window: int) -> np.ndarray:
  """Trailing moving average over `window` points (shorter at the start)."""
  if window <= 1 or len(values) == 0:
    return values
  cumsum = np.cumsum(np.insert(values, 0, 0.0))
  idx = np.arange(1, len(values) + 1)
  lo = np.maximum(idx - window, 0)
  return (cumsum[idx] - cumsum[lo]) / (idx - lo)


def mean_curve(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
  """The mean over seeds at the steps every seed logged."""
  common = curves[0][0]
  for steps, _ in curves[1:]:
    common = np.intersect1d(common, steps)
  values = [np.interp(common, s, v) for s, v in curves]
  return common, np.mean(values, axis=0)


def taper_start(config: Mapping[str, Any]) -> int | None:
  """The step at which the gate starts to fall (schedules.Phases: round(gate_warmup_frac · steps))."""
  try:
    return int(round(config["taper"]["gate_warmup_frac"] * config["train"]["steps"]))
  except (KeyError, TypeError):
    return None


class Curves:
  """Metrics of the complete runs, read once, grouped by size and (variant, aux)."""

  def __init__(self, runs: Sequence[Run], max_points: int = 2000) -> None:
    self.runs = [r for r in runs if r.status == "complete" and r.path]
    self.records = {r.cell: read_metrics(r.path, max_points) for r in self.runs}

  def sizes(self) -> list[str]:
    """Sizes with complete runs, smallest first."""
    return sorted({r.size for r in self.runs}, key=size_order)

  def by_key(self, size: str) -> dict[Key, list[Run]]:
    """Complete runs of one size by (variant, aux), in the table's variant order."""
    out: dict[Key, list[Run]] = {}
    for r in sorted(self.runs, key=lambda r: (variant_order(r.key), r.seed)):
      if r.size == size:
        out.setdefault(r.key, []).append(r)
    return out

  def curves(self, runs: Sequence[Run], key: str, window: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """(steps, values) per run for a metric, optionally smoothed; runs without the metric are left out."""
    out = []
    for r in runs:
      steps, values = series(self.records[r.cell], key)
      if len(steps):
        out.append((steps, smooth(values, window)))
    return out


def new_figure(width: float, height: float) -> Figure:
  """A Figure drawn by the Agg backend (no pyplot, no global backend switch)."""
  fig = Figure(figsize=(width, height), dpi=DPI)
  FigureCanvasAgg(fig)
  return fig


def size_panels(count: int, panel_width: float) -> tuple[Figure, Any]:
  """A figure with one panel per model size in a row (between 7.5 and 20 inches wide), and its axes."""
  fig = new_figure(min(max(panel_width * count, 7.5), 20), 4.8)
  return fig, fig.subplots(1, count, squeeze=False)[0]


def _log_y(ax: Any) -> None:
  """Log y axis with plain-number tick labels, and labelled minor ticks where the data span few decades."""
  ax.set_yscale("log")
  lo, hi = ax.get_ylim()
  decades = math.log10(hi / lo) if lo > 0 else 99
  subs = range(2, 10) if decades <= 1.2 else (2, 5) if decades <= 3 else ()
  ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
  ax.yaxis.set_minor_formatter(FuncFormatter(
      lambda v, _: f"{v:g}" if round(v / 10 ** math.floor(math.log10(v) + 1e-9)) in subs else ""))


def _style(key: Key) -> dict[str, Any]:
  """Colour per variant; unanchored variants dashed."""
  return {"color": COLORS.get(key, "#8c564b"), "linestyle": "--" if unanchored(*key) else "-"}


def _mark_taper(ax: Any, runs: Sequence[Run]) -> None:
  """A dotted vertical line at the taper start (one per panel)."""
  start = next((taper_start(r.config) for r in runs if taper_start(r.config) is not None), None)
  if start is not None:
    ax.axvline(start, color="#888888", linestyle=":", linewidth=1.2, label=f"taper start (step {start})")


def _window(curves: "Curves", size: str) -> int:
  """Moving-average window for per-step curves: about 2% of the logged points."""
  lengths = [len(curves.records[r.cell]) for r in curves.runs if r.size == size]
  return max(1, (max(lengths) if lengths else 0) // 50)


def figure_scaling(groups: Sequence[Group]) -> Figure | None:
  """Figure 2: final val loss (g = 0) against parameter count, log x, a line per variant with std error bars.

  Each size sits at its baseline's parameter count (variants differ by a few γ̃ vectors), the variants
  spread slightly sideways so that their error bars stay apart.
  """
  done = [g for g in groups if g.n and g.params]
  keys = sorted({(g.variant, g.aux) for g in done}, key=variant_order)
  if not keys:
    return None
  sizes = sorted({g.size for g in done}, key=size_order)
  at = {s: float(next((g.params for g in done if g.size == s and (g.variant, g.aux) == ("baseline", 0)),
                      np.median([g.params for g in done if g.size == s]))) for s in sizes}
  fig = new_figure(7.0, 4.6)
  ax = fig.add_subplot()
  for i, key in enumerate(keys):
    shift = 1.0 + 0.025 * (i - (len(keys) - 1) / 2)
    pts = [(at[g.size] * shift, g.mean, g.std or 0.0) for g in sorted(done, key=lambda g: size_order(g.size))
           if (g.variant, g.aux) == key]
    x, y, err = (np.asarray(v, float) for v in zip(*pts))
    ax.errorbar(x, y, yerr=err, marker="o", markersize=4, capsize=3, linewidth=1.5, label=label(*key), **_style(key))
  ax.set_xscale("log")
  ax.set_xticks([at[s] for s in sizes], [f"{s}\n{params_text(int(at[s]))}" for s in sizes])
  ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
  lo, hi = min(at.values()), max(at.values())
  ax.set_xlim(lo / 1.4, hi * 1.4)
  ax.set_xlabel("parameters (log scale)")
  ax.set_ylabel("validation loss at g = 0 (nats/token)")
  ax.set_title("Validation loss vs model size (mean ± std over seeds)")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  return fig


def figure_logit_norm(curves: Curves) -> Figure | None:
  """Figure 3: mean logit L2 norm against step (log y), a panel per size; seeds thin, mean thick; taper start."""
  sizes = [s for s in curves.sizes() if any(curves.curves(rs, "logit_norm") for rs in curves.by_key(s).values())]
  if not sizes:
    return None
  fig, axes = size_panels(len(sizes), 5.2)
  for ax, size in zip(axes, sizes):
    groups = curves.by_key(size)
    for key, runs in groups.items():
      seeds = curves.curves(runs, "logit_norm")
      if not seeds:
        continue
      for steps, values in seeds:
        ax.plot(steps, values, linewidth=0.7, alpha=0.35, **_style(key))
      steps, mean = mean_curve(seeds)
      tag = "unanchored" if unanchored(*key) else "anchored"
      ax.plot(steps, mean, linewidth=2.2, label=f"{label(*key)} — {tag}", **_style(key))
    _mark_taper(ax, [r for rs in groups.values() for r in rs])
    _log_y(ax)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean logit L2 norm (log scale)")
    params = next((r.params for rs in groups.values() for r in rs if r.params), None)
    ax.set_title(f"{size} ({params_text(params)} params)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle("Logit norm: anchored (solid) vs unanchored (dashed); thin lines are seeds, thick the mean")
  fig.tight_layout()
  return fig


def figure_grad_norm(curves: Curves, size: str | None = None) -> Figure | None:
  """Figure 4: gradient norm by weight type against step (log y), mean over seeds per variant, one size."""
  if size is None:
    with_unanchored = [s for s in curves.sizes() if any(unanchored(*k) for k in curves.by_key(s))]
    size = (with_unanchored or curves.sizes() or [None])[-1]
  if size is None:
    return None
  groups = curves.by_key(size)
  window = _window(curves, size)
  fig = new_figure(11, 7.4)
  axes = fig.subplots(2, 2, sharex=True).ravel()
  plotted = False
  for ax, (wkey, title) in zip(axes, WEIGHT_TYPES):
    for key, runs in groups.items():
      seeds = curves.curves(runs, f"grad_norm/{wkey}", window)
      if not seeds:
        continue
      steps, mean = mean_curve(seeds)
      lo = np.min([np.interp(steps, s, v) for s, v in seeds], axis=0)
      hi = np.max([np.interp(steps, s, v) for s, v in seeds], axis=0)
      ax.fill_between(steps, lo, hi, alpha=0.15, color=_style(key)["color"], linewidth=0)
      ax.plot(steps, mean, linewidth=1.6, label=label(*key), **_style(key))
      plotted = True
    _mark_taper(ax, [r for rs in groups.values() for r in rs])
    _log_y(ax)
    ax.set_title(f"{title} weights")
    ax.set_ylabel("gradient L2 norm (log scale)")
    ax.grid(True, which="both", alpha=0.3)
  if not plotted:
    return None
  for ax in axes[2:]:
    ax.set_xlabel("training step")
  axes[0].legend(fontsize=7)
  params = next((r.params for rs in groups.values() for r in rs if r.params), None)
  fig.suptitle(f"Gradient norm by weight type, {size} ({params_text(params)} params); unanchored dashed\n"
               f"mean over seeds (band: min–max over seeds), moving average over {window} steps")
  fig.tight_layout()
  return fig


def figure_train_loss(curves: Curves) -> Figure | None:
  """Training loss of baseline vs internal_taper (+aux), mean over seeds, a panel per size; gate on a twin axis."""
  pair = (("baseline", 0), ("internal_taper", 1))
  sizes = [s for s in curves.sizes() if all(k in curves.by_key(s) for k in pair)]
  if not sizes:
    return None
  fig, axes = size_panels(len(sizes), 5.4)
  for ax, size in zip(axes, sizes):
    groups = curves.by_key(size)
    window = _window(curves, size)
    tail_lo, tail_hi = np.inf, -np.inf
    for key in pair:
      steps, mean = mean_curve(curves.curves(groups[key], "loss", window))
      ax.plot(steps, mean, linewidth=1.6, label=f"{label(*key)} (mean of {len(groups[key])})", **_style(key))
      late = mean[len(mean) // 10:]
      tail_lo, tail_hi = min(tail_lo, late.min()), max(tail_hi, late.max())
    if np.isfinite(tail_lo):
      pad = 0.05 * (tail_hi - tail_lo + 1e-9)
      ax.set_ylim(tail_lo - pad, tail_hi + pad)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"training loss (nats/token, moving average over {window})")
    ax.grid(True, alpha=0.3)
    gate_ax = ax.twinx()
    gate_steps, gate = series(curves.records[groups[pair[1]][0].cell], "gate")
    gate_ax.plot(gate_steps, gate, color="#888888", linestyle=":", linewidth=1.4, label="gate g (internal_taper)")
    gate_ax.set_ylim(-0.02, 1.05)
    gate_ax.set_ylabel("gate g")
    handles = ax.get_legend_handles_labels()
    gate_handles = gate_ax.get_legend_handles_labels()
    ax.legend(handles[0] + gate_handles[0], handles[1] + gate_handles[1], fontsize=7, loc="upper right")
    params = next((r.params for rs in groups.values() for r in rs if r.params), None)
    ax.set_title(f"{size} ({params_text(params)} params)")
  fig.suptitle("Training loss, baseline vs internal_taper (+aux); y axis from 10% of training on")
  fig.tight_layout()
  return fig


# ------------------------------------------------------------------------------------------------ dynamics


def dynamics_markdown(curves: Curves) -> str:
  """Logit norm at the taper start and at the end, and the last-10% gradient norm, per size × variant."""
  rows = []
  for size in curves.sizes():
    groups = curves.by_key(size)
    base_grad = None
    for key, runs in groups.items():
      starts, ends, grads = [], [], []
      for r in runs:
        steps, norms = series(curves.records[r.cell], "logit_norm")
        start = taper_start(r.config)
        if len(steps) and start is not None:
          starts.append(float(np.interp(start, steps, norms)))
          ends.append(float(norms[-1]))
        gsteps, g = series(curves.records[r.cell], "grad_norm")
        if len(g):
          grads.append(float(np.mean(g[gsteps >= 0.9 * gsteps[-1]])))
      grad = float(np.mean(grads)) if grads else None
      if key == ("baseline", 0):
        base_grad = grad
      if not starts:
        continue
      s, e = float(np.mean(starts)), float(np.mean(ends))
      rows.append([size, label(*key), "unanchored" if unanchored(*key) else "anchored", len(runs), f"{s:,.1f}",
                   f"{e:,.1f}", f"{e / s:.2f}×", "?" if grad is None else f"{grad:.3g}",
                   f"{grad / base_grad:.2f}×" if grad and base_grad else "—"])
  if not rows:
    return ""
  return markdown_table(["size", "variant", "final scale", "n", "logit norm at taper start", "logit norm at end",
                         "growth", "grad norm, last 10%", "vs baseline"], rows)


# ------------------------------------------------------------------------------------------------- report


FIGURES = {  # file name → (title in report.md, caption)
    "fig2_val_loss_vs_params.png": "Figure 2 — validation loss against parameter count",
    "fig3_logit_norm.png": "Figure 3 — mean logit L2 norm, anchored vs unanchored",
    "fig4_grad_norm.png": "Figure 4 — gradient norm by weight type",
    "train_loss_gate.png": "Training loss, baseline vs internal_taper (+aux), with the gate",
}


def make_figures(runs: Sequence[Run], groups: Sequence[Group], curves: Curves | None = None) -> dict[str, Figure]:
  """Every figure the runs have data for, by file name."""
  curves = curves or Curves(runs)
  figures = {"fig2_val_loss_vs_params.png": figure_scaling(groups), "fig3_logit_norm.png": figure_logit_norm(curves),
             "fig4_grad_norm.png": figure_grad_norm(curves), "train_loss_gate.png": figure_train_loss(curves)}
  return {name: fig for name, fig in figures.items() if fig is not None}


def save_png(fig: Figure, path: str) -> None:
  """Saves `fig` as a 256-colour palette PNG (about a third of the RGBA file; line plots look the same)."""
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=DPI)
  image = Image.open(buffer).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
  with files.atomic_path(path) as tmp:
    image.save(tmp, format="PNG", optimize=True)


def setup_lines(runs: Sequence[Run]) -> list[str]:
  """What the complete runs were: corpus, sizes with model shape and steps, batch, device."""
  done = [r for r in runs if r.status == "complete" and r.config]
  lines = []
  for size in sorted({r.size for r in done}, key=size_order):
    r = next(r for r in done if r.size == size)
    m, t = r.config.get("model", {}), r.config.get("train", {})
    lines.append(f"* `{size}`: L = {m.get('L')}, d = {m.get('D')}, V = {m.get('V')}, {params_text(r.params)} "
                 f"parameters; {t.get('steps')} steps of {t.get('batch_size')} × {m.get('T')} tokens, peak LR "
                 f"{r.config.get('opt', {}).get('lr')}, corpus `{r.corpus}`, trained on {r.device}")
  return lines


def status_lines(runs: Sequence[Run]) -> list[str]:
  """How many runs are complete, and which are failed, incomplete, never started or missing."""
  complete = sum(r.status == "complete" for r in runs)
  lines = [f"{complete} of {len(runs)} runs complete."]
  for state, what in (("failed", "Failed"), ("incomplete", "Incomplete"), ("pending", "Not started"),
                      ("missing", "Missing (in the sweep's grid, no run directory)")):
    bad = [r for r in runs if r.status == state]
    if state in ("failed", "incomplete"):  # one entry per run, with its error
      items = [f"`{r.cell}`" + (f" ({r.error})" if r.error else "") for r in bad]
    else:  # one entry per size × variant, with its seeds
      seeds: dict[str, list[int]] = {}
      for r in bad:
        seeds.setdefault(f"{r.variant}-{r.size}-aux{r.aux}", []).append(r.seed)
      items = [f"`{name}` seed{'s' if len(v) > 1 else ''} {', '.join(map(str, v))}" for name, v in seeds.items()]
    if items:
      lines.append(f"{what}: " + "; ".join(items) + ".")
  return lines


def report_markdown(workdir: str, runs: Sequence[Run], groups: Sequence[Group], figures: Sequence[str],
                    dynamics: str) -> str:
  """report.md: status, setup, Table 2, the dynamics table and the figures."""
  with_paper = paper_setting(runs)
  listed = manifest.read_manifest(workdir) or {}
  title = listed.get("name") or os.path.basename(os.path.abspath(workdir))
  parts = [f"# Study report: {title}", "",
           (f"Generated {time.strftime('%Y-%m-%d %H:%M')} by `python -m experiments.report` from the run directories "
            f"in `{os.path.basename(os.path.abspath(workdir))}/`; one row per run in `results.csv`."), "",
           "## Status", "", *status_lines(runs), "", "## Setup", "", *setup_lines(runs), "",
           "## Table 2 — validation loss at g = 0", "",
           "Mean ± sample standard deviation (ddof = 1) over the complete seeds, in nats/token, evaluated with the "
           "gate at 0; in brackets the gap to the baseline of the same size; n counts the seeds that finished "
           "(\"n = 2 of 3\": one is missing or failed)."
           + (" Beside each cell: the paper's value (Kanavalau, Amo Alonso and Lall, arXiv 2602.10408, Table 2; "
              "6 seeds)." if with_paper else ""), "", table2_markdown(groups, with_paper), ""]
  if dynamics:
    parts += ["## Logit and gradient norms", "",
              ("Mean over seeds of the mean logit L2 norm at the taper start and at the last diagnostics step, and "
               "of the global gradient norm over the last 10% of steps (its ratio to the baseline's)."), "",
              dynamics, ""]
  for name in figures:
    parts += [f"## {FIGURES[name]}", "", f"![{FIGURES[name]}](figures/{name})", ""]
  return "\n".join(parts)


def write_report(workdir: str, out: str | None = None) -> dict[str, Any]:
  """Reads the study in `workdir`; writes report.md, results.csv and figures/*.png to `out` (default: workdir)."""
  workdir = os.path.abspath(files.local_path(workdir, "--workdir"))  # the study tools read local directories only
  out = os.path.abspath(files.local_path(out or workdir, "--out"))
  if not os.path.isdir(workdir):
    raise ValueError(f"--workdir={workdir}: no such directory")
  runs = read_runs(workdir)
  if not runs:
    raise ValueError(f"--workdir={workdir}: no run directories (results.json / config.json) and no sweep.json")
  groups = aggregate(runs)
  curves = Curves(runs)
  os.makedirs(os.path.join(out, "figures"), exist_ok=True)
  figures = make_figures(runs, groups, curves)
  for name, fig in figures.items():
    save_png(fig, os.path.join(out, "figures", name))
  write_text_atomically(os.path.join(out, "results.csv"), csv_text(runs))
  text = report_markdown(workdir, runs, groups, list(figures), dynamics_markdown(curves))
  write_text_atomically(os.path.join(out, "report.md"), text)
  return {"report": os.path.join(out, "report.md"), "csv": os.path.join(out, "results.csv"),
          "figures": [os.path.join(out, "figures", n) for n in figures], "runs": len(runs),
          "complete": sum(r.status == "complete" for r in runs)}
