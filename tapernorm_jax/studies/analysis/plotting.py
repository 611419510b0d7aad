"""The house style of a study's figures: a colour per method (unanchored dashed), Agg figures without pyplot,
panels per size, log axes with readable ticks, the taper start marked, and 256-colour PNGs."""

import io
import math
from collections.abc import Sequence
from typing import Any
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter
from PIL import Image
from tapernorm_jax.storage import run_files
from tapernorm_jax.studies.analysis.curves import Curves, taper_start
from tapernorm_jax.studies.analysis.run_rows import (
  Key,
  Run,
  unanchored,
)


COLORS = {
  ("baseline", 0): "#222222",
  ("internal_taper", 1): "#1f77b4",
  ("all_taper", 1): "#2ca02c",
  ("final_taper", 1): "#9467bd",
  ("internal_taper", 0): "#17becf",
  ("all_taper", 0): "#d62728",
  ("final_taper", 0): "#ff7f0e",
  ("baseline", 1): "#7f7f7f",
  ("fakeln", 1): "#e377c2",
  ("prepbn", 0): "#bcbd22",
  ("dyt", 0): "#8c564b",
  ("derf", 0): "#ff9896",
}


DPI = 110


def new_figure(width: float, height: float) -> Figure:
  """A Figure drawn by the Agg backend (no pyplot, no global backend switch)."""
  fig = Figure(figsize=(width, height), dpi=DPI)
  FigureCanvasAgg(fig)
  return fig


def size_panels(count: int, panel_width: float) -> tuple[Figure, Any]:
  """A figure with one panel per model size in a row (between 7.5 and 20 inches wide), and its axes."""
  fig = new_figure(min(max(panel_width * count, 7.5), 20), 4.8)
  return fig, fig.subplots(1, count, squeeze=False)[0]


def log_y(ax: Any) -> None:
  """Log y axis with plain-number tick labels, and labelled minor ticks where the data span few decades."""
  ax.set_yscale("log")
  lo, hi = ax.get_ylim()
  decades = math.log10(hi / lo) if lo > 0 else 99
  subs = range(2, 10) if decades <= 1.2 else (2, 5) if decades <= 3 else ()
  ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
  ax.yaxis.set_minor_formatter(
    FuncFormatter(lambda v, _: f"{v:g}" if round(v / 10 ** math.floor(math.log10(v) + 1e-9)) in subs else "")
  )


def method_style(key: Key) -> dict[str, Any]:
  """Colour per variant; unanchored variants dashed."""
  return {"color": COLORS.get(key, "#17becf"), "linestyle": "--" if unanchored(*key) else "-"}


def mark_taper(ax: Any, runs: Sequence[Run]) -> None:
  """A dotted vertical line at the taper start (one per panel)."""
  start = next((taper_start(r.config) for r in runs if taper_start(r.config) is not None), None)
  if start is not None:
    ax.axvline(start, color="#888888", linestyle=":", linewidth=1.2, label=f"taper start (step {start})")


def smoothing_window(curves: Curves, size: str) -> int:
  """Moving-average window for per-step curves: about 2% of the logged points."""
  lengths = [len(curves.records[r.cell]) for r in curves.runs if r.size == size]
  return max(1, (max(lengths) if lengths else 0) // 50)


def save_png(fig: Figure, path: str) -> None:
  """Saves `fig` as a 256-colour palette PNG (about a third of the RGBA file; line plots look the same)."""
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=DPI)
  image = Image.open(buffer).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
  with run_files.atomic_path(path) as tmp:
    image.save(tmp, format="PNG", optimize=True)
